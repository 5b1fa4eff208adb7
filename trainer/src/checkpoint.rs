//! The checkpoint file: one file holding the full training state, written atomically.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! "CVGTRAIN" | format version u32 | header length u32 | header (JSON) |
//! payload length u64 | payload (safetensors: weights and Adam moments) | CRC-32 of all before
//! ```
//!
//! The header carries the model, every setting that changes the training math (`--size`,
//! `--batch`, `--lr`, `--seed`), the step, the elapsed training time and Adam's step count.
//! RNG state and data order need no bytes: they are functions of `(seed, step)`
//! ([`crate::rng`]). Why a checksum over the whole file: a torn or flipped file must be refused
//! by name, never loaded as garbage weights or silently replaced by a fresh start.
//!
//! Writing goes to a temporary file beside the target, which is fsynced and renamed over it,
//! and the directory is fsynced: a reader sees the old checkpoint or the new one, never half.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{Error, Result};

/// The checkpoint's file name inside the checkpoint directory.
pub const FILE_NAME: &str = "converge-trainer.ckpt";
/// First bytes of every checkpoint.
pub const MAGIC: &[u8; 8] = b"CVGTRAIN";
/// Version of the layout above; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// What the checkpoint says about the run that wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Model name.
    pub model: String,
    /// `--size`.
    pub size: usize,
    /// `--batch`.
    pub batch: usize,
    /// `--lr`.
    pub lr: f64,
    /// `--seed`.
    pub seed: u64,
    /// Steps completed.
    pub step: u64,
    /// Training seconds so far, across restarts.
    pub elapsed_s: f64,
    /// Adam's update count.
    pub adam_t: u64,
}

impl Header {
    /// The header for `cfg` at `step`.
    pub fn for_config(cfg: &Config, step: u64, elapsed_s: f64, adam_t: u64) -> Self {
        Header {
            model: cfg.model.name().to_string(),
            size: cfg.size,
            batch: cfg.batch,
            lr: cfg.lr,
            seed: cfg.seed,
            step,
            elapsed_s,
            adam_t,
        }
    }

    /// Refuses a checkpoint written by another model or with a setting that changes the
    /// training math. `--steps` may differ (extending a run is allowed), as may `--threads`
    /// and the reporting intervals.
    pub fn check_compatible(&self, cfg: &Config, path: &Path) -> Result<()> {
        if self.model != cfg.model.name() {
            return Err(Error::WrongModel {
                path: path.to_path_buf(),
                found: self.model.clone(),
                expected: cfg.model.name().to_string(),
            });
        }
        let mismatch = |flag, found: String, expected: String| {
            Err(Error::ConfigMismatch {
                path: path.to_path_buf(),
                flag,
                found,
                expected,
            })
        };
        if self.size != cfg.size {
            return mismatch("--size", self.size.to_string(), cfg.size.to_string());
        }
        if self.batch != cfg.batch {
            return mismatch("--batch", self.batch.to_string(), cfg.batch.to_string());
        }
        if self.lr.to_bits() != cfg.lr.to_bits() {
            return mismatch("--lr", self.lr.to_string(), cfg.lr.to_string());
        }
        if self.seed != cfg.seed {
            return mismatch("--seed", self.seed.to_string(), cfg.seed.to_string());
        }
        Ok(())
    }
}

/// A checkpoint read back from disk.
#[derive(Debug)]
pub struct Checkpoint {
    /// The header.
    pub header: Header,
    /// Weights (`param/<name>`) and optimizer state (`adam.m/<name>`, `adam.v/<name>`).
    pub tensors: HashMap<String, Tensor>,
}

/// The checkpoint path inside `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Encodes a checkpoint into the file layout.
pub fn encode(header: &Header, tensors: &HashMap<String, Tensor>) -> Result<Vec<u8>> {
    let header_json = serde_json::to_vec(header).expect("header serializes");
    let payload = safetensors::tensor::serialize(tensors, None)
        .map_err(|e| Error::Tensor(candle_core::Error::Msg(format!("safetensors: {e}"))))?;
    let mut buf = Vec::with_capacity(32 + header_json.len() + payload.len());
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf.extend_from_slice(&(header_json.len() as u32).to_le_bytes());
    buf.extend_from_slice(&header_json);
    buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    buf.extend_from_slice(&payload);
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    Ok(buf)
}

/// Writes the checkpoint atomically to `path` (temp file, fsync, rename, fsync directory);
/// returns its size in bytes.
pub fn save(path: &Path, header: &Header, tensors: &HashMap<String, Tensor>) -> Result<u64> {
    let bytes = encode(header, tensors)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let io = |what, p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io {
            what,
            path: p,
            source,
        }
    };
    fs::create_dir_all(dir).map_err(io("creating checkpoint directory", dir))?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    {
        let mut f = fs::File::create(&tmp).map_err(io("creating", &tmp))?;
        f.write_all(&bytes).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("syncing", &tmp))?;
    }
    fs::rename(&tmp, path).map_err(io("renaming checkpoint to", path))?;
    // The rename is durable only once the directory entry is.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing directory", dir))?;
    Ok(bytes.len() as u64)
}

/// Reads and verifies a checkpoint file (magic, checksum, version, header, tensors). Whether it
/// fits the current run is [`Header::check_compatible`]'s question.
pub fn load(path: &Path) -> Result<Checkpoint> {
    let bytes = fs::read(path).map_err(|source| Error::Io {
        what: "reading checkpoint",
        path: path.to_path_buf(),
        source,
    })?;
    decode(&bytes, path)
}

/// Decodes the file layout; `path` only names the file in errors.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint> {
    let corrupt = |why: String| Error::CorruptCheckpoint {
        path: path.to_path_buf(),
        why,
    };
    const MIN: usize = 8 + 4 + 4 + 8 + 4;
    if bytes.len() < MIN {
        return Err(corrupt(format!("only {} bytes (truncated?)", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(corrupt(
            "not a converge-trainer checkpoint (bad magic)".into(),
        ));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    let actual = crc32fast::hash(body);
    if stored != actual {
        return Err(corrupt(format!(
            "checksum mismatch (stored {stored:08x}, computed {actual:08x}): truncated or damaged"
        )));
    }
    let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(Error::UnsupportedCheckpointVersion {
            path: path.to_path_buf(),
            found: version,
            expected: FORMAT_VERSION,
        });
    }
    let header_len = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")) as usize;
    let rest = &body[16..];
    if header_len + 8 > rest.len() {
        return Err(corrupt(format!(
            "header length {header_len} runs past the end"
        )));
    }
    let header: Header = serde_json::from_slice(&rest[..header_len])
        .map_err(|e| corrupt(format!("header is not valid: {e}")))?;
    let rest = &rest[header_len..];
    let payload_len = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
    let payload = &rest[8..];
    if payload_len != payload.len() as u64 {
        return Err(corrupt(format!(
            "payload is {} bytes, header says {payload_len}",
            payload.len()
        )));
    }
    let tensors = candle_core::safetensors::load_buffer(payload, &Device::Cpu)
        .map_err(|e| corrupt(format!("tensors unreadable: {e}")))?;
    Ok(Checkpoint { header, tensors })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ModelKind;

    fn sample() -> (Header, HashMap<String, Tensor>) {
        let cfg = Config::new(ModelKind::LogregWine);
        let h = Header::for_config(&cfg, 12, 3.5, 12);
        let t = Tensor::new(&[1.0f32, 2.0, 3.0], &Device::Cpu).unwrap();
        (h, HashMap::from([("param/w".to_string(), t)]))
    }

    #[test]
    fn round_trips_exactly() {
        let (h, t) = sample();
        let bytes = encode(&h, &t).unwrap();
        let back = decode(&bytes, Path::new("x")).unwrap();
        assert_eq!(back.header, h);
        assert_eq!(
            back.tensors["param/w"].to_vec1::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0]
        );
    }

    #[test]
    fn any_flipped_or_missing_byte_is_refused_as_corrupt() {
        let (h, t) = sample();
        let bytes = encode(&h, &t).unwrap();
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(
                matches!(
                    decode(&b, Path::new("x")),
                    Err(Error::CorruptCheckpoint { .. })
                ),
                "flip at {i} was not refused"
            );
        }
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1], Path::new("x")),
            Err(Error::CorruptCheckpoint { .. })
        ));
    }

    #[test]
    fn another_model_or_batch_is_refused_by_name() {
        let (h, _) = sample();
        let other = Config::new(ModelKind::MlpDigits);
        assert!(matches!(
            h.check_compatible(&other, Path::new("x")),
            Err(Error::WrongModel { .. })
        ));
        let mut cfg = Config::new(ModelKind::LogregWine);
        cfg.batch += 1;
        assert!(matches!(
            h.check_compatible(&cfg, Path::new("x")),
            Err(Error::ConfigMismatch {
                flag: "--batch",
                ..
            })
        ));
        cfg.batch -= 1;
        cfg.steps *= 2; // extending a run is fine
        h.check_compatible(&cfg, Path::new("x")).unwrap();
    }
}
