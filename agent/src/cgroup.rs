//! The worker's cgroup parent: how a worker's CPU capacity is enforced, and where per-container
//! usage is read from.
//!
//! Every container of a worker is started with `HostConfig.cgroup_parent` = the worker's parent
//! (`/converge/<worker-id>` by default). The agent creates that cgroup at startup and caps its
//! CPU at the worker's capacity, so jobs on one worker never borrow CPU from another even when
//! several workers share one Docker engine (the testbed). Only Docker's `cgroupfs` driver is
//! supported: its containers live at `<parent>/<container id>`.
//!
//! - cgroup v1: `cpu/<parent>/cpu.cfs_quota_us` = capacity × `cpu.cfs_period_us`. The kernel
//!   rejects a child quota above its parent's, so every container limit is clamped to the
//!   capacity ([`clamp_cpus`]). Usage: `cpuacct/<parent>/<id>/cpuacct.usage` (ns) and
//!   `memory/<parent>/<id>/memory.usage_in_bytes`.
//! - cgroup v2: `<parent>/cpu.max` = `"<quota> <period>"`, with the `cpu` controller enabled on
//!   the way down. Usage: `<parent>/<id>/cpu.stat` (`usage_usec`) and `memory.current`.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Which cgroup hierarchy the host runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// One hierarchy per controller (`cpu/`, `cpuacct/`, `memory/`, ...).
    V1,
    /// The unified hierarchy.
    V2,
}

// The quota math every limit goes through lives in the pure policy crate, so the simulator
// applies limits exactly as the agent does (`converge_policy::limits`).
pub use converge_policy::limits::{MIN_CPUS, clamp_cpus};

/// CFS period used when the parent's cannot be read (the kernel default, 100 ms).
const DEFAULT_PERIOD_US: u64 = 100_000;

/// The worker's parent cgroup.
#[derive(Clone, Debug)]
pub struct WorkerCgroup {
    root: PathBuf,
    /// Relative to each hierarchy's root, without leading or trailing `/`.
    parent: String,
    version: CgroupVersion,
}

/// The worker's cgroup taken by this agent ([`WorkerCgroup::create`]): an exclusive `flock`
/// on its CPU directory, let go when this is dropped or the process ends, however it ends.
/// Held by the agent's run alone, not by the tasks that read the cgroup, so that an agent
/// stopped in-process (a test) lets go at once.
#[derive(Debug)]
#[must_use = "the cgroup is this agent's only while the lease lives"]
pub struct Lease(#[allow(dead_code)] fs::File);

impl WorkerCgroup {
    /// Detects the cgroup version under `root` (usually `/sys/fs/cgroup`).
    pub fn detect(root: &Path, parent: &str) -> Result<Self> {
        let version = if root.join("cgroup.controllers").exists() {
            CgroupVersion::V2
        } else if root.join("cpu").join("cpu.cfs_quota_us").exists() {
            CgroupVersion::V1
        } else {
            return Err(Error::CgroupUnsupported {
                path: root.to_path_buf(),
                why: "neither cgroup v2 (cgroup.controllers) nor a v1 cpu controller \
                      (cpu/cpu.cfs_quota_us) is mounted there; set --cgroup-root to where the \
                      host's cgroup filesystem is mounted"
                    .into(),
            });
        };
        Ok(Self::with_version(root, parent, version))
    }

    /// A worker cgroup of a known version (no filesystem access).
    pub fn with_version(root: &Path, parent: &str, version: CgroupVersion) -> Self {
        Self {
            root: root.to_path_buf(),
            parent: parent.trim_matches('/').to_string(),
            version,
        }
    }

    /// The hierarchy version.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The value for Docker's `HostConfig.cgroup_parent`.
    pub fn docker_parent(&self) -> String {
        format!("/{}", self.parent)
    }

    /// The directory whose CPU quota caps the worker.
    pub fn cpu_dir(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.root.join("cpu").join(&self.parent),
            CgroupVersion::V2 => self.root.join(&self.parent),
        }
    }

    /// Creates the parent cgroup (if missing), takes it for this agent, and caps it at `cpus`
    /// cores.
    ///
    /// Taking it is an exclusive `flock` on its directory, which every process on the host
    /// sees (agents in containers too, through the host's cgroup filesystem): a second agent
    /// given the same `--worker-id` on one host fails here, before it changes the first's
    /// quota or, at its exit, removes the cgroup its containers run in.
    pub fn create(&self, cpus: f64) -> Result<Lease> {
        let dir = self.cpu_dir();
        fs::create_dir_all(&dir).map_err(|source| Error::Cgroup {
            path: dir.clone(),
            source,
        })?;
        let file = fs::File::open(&dir).map_err(|source| Error::Cgroup {
            path: dir.clone(),
            source,
        })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(Error::WorkerTaken { path: dir }),
            Err(fs::TryLockError::Error(source)) => {
                return Err(Error::Cgroup { path: dir, source });
            }
        }
        let lease = Lease(file);
        match self.version {
            CgroupVersion::V1 => {
                let period = read_u64(&dir.join("cpu.cfs_period_us")).unwrap_or(DEFAULT_PERIOD_US);
                write(
                    &dir.join("cpu.cfs_quota_us"),
                    &quota_us(cpus, period).to_string(),
                )
            }
            CgroupVersion::V2 => {
                // A controller is usable in a cgroup only when every ancestor enables it for
                // its children; enabling is idempotent, and failing on the root (already on,
                // or delegated elsewhere) is not fatal as long as cpu.max then exists.
                let mut p = self.root.clone();
                let _ = fs::write(p.join("cgroup.subtree_control"), "+cpu +memory");
                for seg in self.parent.split('/') {
                    p = p.join(seg);
                    let _ = fs::write(p.join("cgroup.subtree_control"), "+cpu +memory");
                }
                write(
                    &dir.join("cpu.max"),
                    &format!(
                        "{} {}",
                        quota_us(cpus, DEFAULT_PERIOD_US),
                        DEFAULT_PERIOD_US
                    ),
                )
            }
        }?;
        Ok(lease)
    }

    /// Caps the memory of all the worker's containers together at `bytes`.
    pub fn set_memory_limit(&self, bytes: u64) -> Result<()> {
        let dir = match self.version {
            CgroupVersion::V1 => self.root.join("memory").join(&self.parent),
            CgroupVersion::V2 => self.root.join(&self.parent),
        };
        fs::create_dir_all(&dir).map_err(|source| Error::Cgroup {
            path: dir.clone(),
            source,
        })?;
        match self.version {
            CgroupVersion::V1 => write(&dir.join("memory.limit_in_bytes"), &bytes.to_string()),
            CgroupVersion::V2 => write(&dir.join("memory.max"), &bytes.to_string()),
        }
    }

    /// The CPU capacity currently enforced on the parent, in cores (`None` = unlimited).
    pub fn capacity(&self) -> Result<Option<f64>> {
        let dir = self.cpu_dir();
        match self.version {
            CgroupVersion::V1 => {
                let q = read_string(&dir.join("cpu.cfs_quota_us"))?;
                let p = read_u64(&dir.join("cpu.cfs_period_us")).unwrap_or(DEFAULT_PERIOD_US);
                Ok(q.trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|q| *q > 0)
                    .map(|q| q as f64 / p as f64))
            }
            CgroupVersion::V2 => {
                let s = read_string(&dir.join("cpu.max"))?;
                Ok(parse_cpu_max(&s))
            }
        }
    }

    /// Removes the parent (and its empty ancestors) in every hierarchy where it exists.
    /// Returns false when the parent still holds containers (it is then left in place).
    pub fn remove_if_empty(&self) -> bool {
        let hierarchies: Vec<PathBuf> = match self.version {
            CgroupVersion::V1 => fs::read_dir(&self.root)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                        .map(|e| e.path())
                        .collect()
                })
                .unwrap_or_default(),
            CgroupVersion::V2 => vec![self.root.clone()],
        };
        let mut empty = true;
        for h in hierarchies {
            let leaf = h.join(&self.parent);
            if !leaf.exists() {
                continue;
            }
            // rmdir on a cgroup fails unless it has no child cgroups and no tasks: exactly the
            // "empty" test we want, without racing Docker.
            if fs::remove_dir(&leaf).is_err() {
                empty = false;
                continue;
            }
            let mut up = leaf.parent();
            while let Some(dir) = up {
                if dir == h || fs::remove_dir(dir).is_err() {
                    break;
                }
                up = dir.parent();
            }
        }
        empty
    }

    /// Where a container's usage counters live.
    pub fn container_usage_paths(&self, container_id: &str) -> UsagePaths {
        match self.version {
            CgroupVersion::V1 => UsagePaths {
                version: CgroupVersion::V1,
                cpu: self
                    .root
                    .join("cpuacct")
                    .join(&self.parent)
                    .join(container_id)
                    .join("cpuacct.usage"),
                memory: self
                    .root
                    .join("memory")
                    .join(&self.parent)
                    .join(container_id)
                    .join("memory.usage_in_bytes"),
            },
            CgroupVersion::V2 => {
                let dir = self.root.join(&self.parent).join(container_id);
                UsagePaths {
                    version: CgroupVersion::V2,
                    cpu: dir.join("cpu.stat"),
                    memory: dir.join("memory.current"),
                }
            }
        }
    }
}

/// A container's usage counter files.
#[derive(Clone, Debug)]
pub struct UsagePaths {
    version: CgroupVersion,
    /// Cumulative CPU time (`cpuacct.usage` in ns, or `cpu.stat` with `usage_usec`).
    pub cpu: PathBuf,
    /// Current memory use in bytes.
    pub memory: PathBuf,
}

impl UsagePaths {
    /// Reads (cumulative CPU ns, memory bytes).
    pub fn read(&self) -> std::io::Result<(u64, u64)> {
        let cpu = match self.version {
            CgroupVersion::V1 => parse_u64_io(&fs::read_to_string(&self.cpu)?)?,
            CgroupVersion::V2 => {
                let s = fs::read_to_string(&self.cpu)?;
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(|us| us * 1000)
                    .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidData, "no usage_usec"))?
            }
        };
        let mem = parse_u64_io(&fs::read_to_string(&self.memory)?)?;
        Ok((cpu, mem))
    }
}

/// The CFS quota for `cpus` cores in a period of `period_us` (at least 1 ms, the kernel's floor).
pub fn quota_us(cpus: f64, period_us: u64) -> i64 {
    ((cpus * period_us as f64).round() as i64).max(1000)
}

/// Docker's `NanoCpus` for a number of cores.
pub fn nano_cpus(cpus: f64) -> i64 {
    (cpus * 1e9).round() as i64
}

/// Reads cgroup v2 `cpu.max` ("max 100000" or "150000 100000") as cores.
pub fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let q = it.next()?;
    let p: f64 = it
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_PERIOD_US as f64);
    if q == "max" {
        return None;
    }
    q.parse::<f64>().ok().map(|q| q / p)
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|source| Error::Cgroup {
        path: path.to_path_buf(),
        source,
    })
}

fn read_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| Error::Cgroup {
        path: path.to_path_buf(),
        source,
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn parse_u64_io(s: &str) -> std::io::Result<u64> {
    s.trim()
        .parse()
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidData, format!("not a number: {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two agents with one worker id on one host: the second fails at its start and leaves
    /// the first's quota as it was; once the first is gone, the cgroup can be taken again.
    #[test]
    fn a_worker_cgroup_is_taken_by_one_agent_at_a_time() {
        let root = std::env::temp_dir().join(format!("converge-cg-{}", std::process::id()));
        let first = WorkerCgroup::with_version(&root, "converge/w1", CgroupVersion::V1);
        let lease = first.create(2.0).unwrap();
        let quota = first.cpu_dir().join("cpu.cfs_quota_us");
        assert_eq!(fs::read_to_string(&quota).unwrap(), "200000");
        let second = WorkerCgroup::with_version(&root, "converge/w1", CgroupVersion::V1);
        let e = second.create(0.3).unwrap_err();
        assert!(matches!(e, Error::WorkerTaken { .. }), "{e}");
        assert!(e.to_string().contains("--worker-id"), "{e}");
        assert_eq!(fs::read_to_string(&quota).unwrap(), "200000");
        // The lease, not the cgroup's handle (which tasks share), holds it.
        drop(lease);
        let _lease = second.create(0.3).unwrap();
        assert_eq!(fs::read_to_string(&quota).unwrap(), "30000");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn quota_is_capacity_times_period() {
        assert_eq!(quota_us(2.0, 100_000), 200_000);
        assert_eq!(quota_us(1.5, 100_000), 150_000);
        assert_eq!(quota_us(0.25, 50_000), 12_500);
        // The kernel refuses quotas under 1 ms.
        assert_eq!(quota_us(0.001, 100_000), 1000);
    }

    #[test]
    fn container_limits_are_clamped_to_the_worker() {
        assert_eq!(clamp_cpus(4.0, 2.0), 2.0);
        assert_eq!(clamp_cpus(0.5, 2.0), 0.5);
        assert_eq!(clamp_cpus(0.0, 2.0), 2.0);
        assert_eq!(clamp_cpus(f64::NAN, 1.5), 1.5);
        assert_eq!(clamp_cpus(0.001, 2.0), MIN_CPUS);
        assert_eq!(nano_cpus(1.5), 1_500_000_000);
    }

    #[test]
    fn paths_follow_the_hierarchy() {
        let v1 = WorkerCgroup::with_version(
            Path::new("/sys/fs/cgroup"),
            "/converge/w1/",
            CgroupVersion::V1,
        );
        assert_eq!(v1.docker_parent(), "/converge/w1");
        assert_eq!(v1.cpu_dir(), Path::new("/sys/fs/cgroup/cpu/converge/w1"));
        let p = v1.container_usage_paths("abc");
        assert_eq!(
            p.cpu,
            Path::new("/sys/fs/cgroup/cpuacct/converge/w1/abc/cpuacct.usage")
        );
        assert_eq!(
            p.memory,
            Path::new("/sys/fs/cgroup/memory/converge/w1/abc/memory.usage_in_bytes")
        );
        let v2 = WorkerCgroup::with_version(
            Path::new("/sys/fs/cgroup"),
            "converge/w1",
            CgroupVersion::V2,
        );
        assert_eq!(v2.cpu_dir(), Path::new("/sys/fs/cgroup/converge/w1"));
        assert_eq!(
            v2.container_usage_paths("abc").cpu,
            Path::new("/sys/fs/cgroup/converge/w1/abc/cpu.stat")
        );
    }

    #[test]
    fn cpu_max_is_read_as_cores() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
    }

    #[test]
    fn v1_and_v2_files_are_created_and_read_in_a_fake_root() {
        let tmp = std::env::temp_dir().join(format!("converge-cg-{}", uuid::Uuid::new_v4()));
        // v1 layout
        let v1root = tmp.join("v1");
        fs::create_dir_all(v1root.join("cpu")).unwrap();
        fs::write(v1root.join("cpu/cpu.cfs_quota_us"), "-1").unwrap();
        let cg = WorkerCgroup::detect(&v1root, "/converge/w1").unwrap();
        assert_eq!(cg.version(), CgroupVersion::V1);
        let _v1 = cg.create(1.5).unwrap();
        // A plain directory has no cfs_period_us: the default period is assumed.
        assert_eq!(
            fs::read_to_string(v1root.join("cpu/converge/w1/cpu.cfs_quota_us")).unwrap(),
            "150000"
        );
        // v2 layout
        let v2root = tmp.join("v2");
        fs::create_dir_all(&v2root).unwrap();
        fs::write(v2root.join("cgroup.controllers"), "cpu memory").unwrap();
        let cg = WorkerCgroup::detect(&v2root, "/converge/w2").unwrap();
        assert_eq!(cg.version(), CgroupVersion::V2);
        let _v2 = cg.create(0.5).unwrap();
        assert_eq!(cg.capacity().unwrap(), Some(0.5));
        let dir = v2root.join("converge/w2/c1");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
        fs::write(dir.join("memory.current"), "4096\n").unwrap();
        assert_eq!(
            cg.container_usage_paths("c1").read().unwrap(),
            (1_500_000, 4096)
        );
        fs::remove_dir_all(&tmp).unwrap();
    }
}
