//! An optional TOML file of settings for the manager and the agent, beside flags and
//! `CONVERGE_*` variables (issue 16).
//!
//! The file's keys are the flags' names (`heartbeat-interval = "500ms"`, `policy =
//! "converge"`, `label = ["zone=a", "gpu=no"]` for a repeated flag). Rather than a second way
//! to read settings, each key becomes the flag it names, placed before the command line, so
//! that the binary's one parser checks it with the same rules and the same error messages. The
//! order of precedence is: the command line, then a `CONVERGE_*` variable, then the file, then
//! the default (a key whose variable is set is left out; a flag given on the command line comes
//! later and wins, as the parsers let a flag override an earlier one).
//!
//! A variable set to the empty string is unset, as shells and compose files mean it
//! (`CONVERGE_TLS_CA=`, `${CA:-}`): [`parse`] is every binary's parser of flags and
//! variables. Read as given, an empty one was its flag with no value, refused with an error
//! that named the flag, not the variable the user had set.

use std::ffi::OsString;
use std::path::PathBuf;

/// The flag naming the file, and its variable.
pub const FLAG: &str = "--config";
/// The variable naming the file when the flag is not given.
pub const ENV: &str = "CONVERGE_CONFIG";

/// What is wrong with a settings file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// It cannot be read.
    #[error("cannot read the settings file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not TOML, or a value is not a string, number, boolean or list of them.
    #[error("the settings file {path}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What to fix.
        why: String,
    },
}

/// A command line with the settings file's flags in it ([`read`]).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The binary's name, the file's flags, then the flags given.
    pub args: Vec<OsString>,
    /// The settings file, if one was named.
    pub file: Option<PathBuf>,
    /// The file's keys, in the order their flags come.
    keys: Vec<String>,
}

impl Settings {
    /// When an error about the settings names a flag that only the file gave (the parser
    /// sees the file's keys as flags, and says `--polcy` where the user wrote `polcy =`), a
    /// line naming the file and its key, to print after the error.
    pub fn blame(&self, error: &str) -> Option<String> {
        let file = self.file.as_ref()?;
        // The error's own line: the parser's usage line and tips below it name other flags.
        let error = error.lines().next().unwrap_or_default();
        let key = self.keys.iter().find(|key| names_flag(error, key))?;
        // A flag given on the command line too overrode the file's: the error is about that.
        let given = self.args.get(1 + self.keys.len()..).unwrap_or_default();
        let typed = given.iter().any(|a| {
            a.to_str()
                .and_then(|a| a.strip_prefix("--"))
                .is_some_and(|a| a == *key || a.starts_with(&format!("{key}=")))
        });
        (!typed).then(|| format!("`{key}` is set in the settings file {}", file.display()))
    }
}

/// Whether `error` names flag `--key` (not a longer flag that starts with it).
fn names_flag(error: &str, key: &str) -> bool {
    let flag = format!("--{key}");
    error.match_indices(&flag).any(|(at, _)| {
        error[at + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'))
    })
}

/// The command line `args` (the binary's name first) with the settings of the file named by
/// `--config FILE` (or `CONVERGE_CONFIG`) placed before the given flags.
pub fn with_file(args: Vec<OsString>) -> Result<Vec<OsString>, ConfigFileError> {
    read(args).map(|s| s.args)
}

/// [`with_file`], keeping what [`Settings::blame`] needs to name the file in an error.
pub fn read(args: Vec<OsString>) -> Result<Settings, ConfigFileError> {
    let named = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| {
            let a = a.to_str()?;
            if a == FLAG {
                args.get(i + 1).map(PathBuf::from)
            } else {
                a.strip_prefix("--config=").map(PathBuf::from)
            }
        })
        .or_else(|| set(ENV).map(PathBuf::from));
    let Some(path) = named else {
        return Ok(Settings {
            args,
            ..Settings::default()
        });
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigFileError::Read {
        path: path.clone(),
        source,
    })?;
    let from_file = flags(&text, |key| set(&env_name(key)).is_some()).map_err(|why| {
        ConfigFileError::Invalid {
            path: path.clone(),
            why,
        }
    })?;
    let mut out = Vec::with_capacity(args.len() + from_file.len());
    let mut given = args.into_iter();
    out.extend(given.next());
    // `--key=value`: the key is what comes before the first `=`.
    let keys = from_file
        .iter()
        .map(|f| f[2..].split('=').next().unwrap_or_default().to_string())
        .collect();
    out.extend(from_file.into_iter().map(OsString::from));
    out.extend(given);
    Ok(Settings {
        args: out,
        file: Some(path),
        keys,
    })
}

/// Variable `name`'s value, if it is set to something (module doc: empty is unset).
fn set(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// Parses `args` (the binary's name first) into `T`, flags first, then the `CONVERGE_*`
/// variables that are set to something (module doc), then the defaults.
pub fn parse<T: clap::Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<T, clap::Error> {
    let mut cmd = T::command();
    // clap reads each variable as the command is built; those set to nothing are not read.
    let empty: Vec<clap::Id> = (cmd.get_arguments())
        .filter(|a| (a.get_env()).is_some_and(set_empty))
        .map(|a| a.get_id().clone())
        .collect();
    for id in empty {
        cmd = cmd.mut_arg(id, |a| a.env(None::<&'static str>));
    }
    let mut matches = cmd.try_get_matches_from_mut(args)?;
    T::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

/// Whether variable `name` is set, to the empty string.
fn set_empty(name: &std::ffi::OsStr) -> bool {
    std::env::var_os(name).is_some_and(|v| v.is_empty())
}

/// `CONVERGE_HEARTBEAT_INTERVAL` for `heartbeat-interval`.
pub fn env_name(key: &str) -> String {
    format!("CONVERGE_{}", key.to_uppercase().replace('-', "_"))
}

/// The flags the TOML `text` stands for, leaving out keys `skip` says are set elsewhere.
pub fn flags(text: &str, skip: impl Fn(&str) -> bool) -> Result<Vec<String>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = Vec::new();
    for (key, value) in table {
        if key == "config" {
            return Err("`config` cannot name another settings file".into());
        }
        if skip(&key) {
            continue;
        }
        let values = match value {
            toml::Value::Array(items) => items,
            one => vec![one],
        };
        for v in values {
            let text = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(format!(
                        "`{key}` is a {}; give a string, number, boolean or a list of them",
                        other.type_str()
                    ));
                }
            };
            out.push(format!("--{key}={text}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_flags_and_set_variables_win() {
        let text = "policy = \"converge\"\nlost-after = 5\nlabel = [\"zone=a\", \"gpu=no\"]\n";
        let f = flags(text, |_| false).unwrap();
        assert_eq!(
            f,
            [
                "--label=zone=a",
                "--label=gpu=no",
                "--lost-after=5",
                "--policy=converge"
            ]
        );
        let f = flags(text, |k| k == "policy").unwrap();
        assert!(!f.iter().any(|a| a.starts_with("--policy")), "{f:?}");
        assert_eq!(
            env_name("heartbeat-interval"),
            "CONVERGE_HEARTBEAT_INTERVAL"
        );
    }

    /// `polcy = "converge"` in the file is `--polcy` to the parser: its error is said to come
    /// from the file, and an error about a flag typed on the command line is not.
    #[test]
    fn an_error_about_a_key_of_the_file_names_the_file() {
        let dir = std::env::temp_dir().join(format!("converge-blame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.toml");
        std::fs::write(&file, "polcy = \"converge\"\nlost-after = 0\n").unwrap();
        let args = |extra: &[&str]| {
            let mut a: Vec<OsString> = vec!["m".into(), "--config".into(), file.clone().into()];
            a.extend(extra.iter().map(OsString::from));
            read(a).unwrap()
        };
        let s = args(&[]);
        let blamed = s
            .blame("error: unexpected argument '--polcy' found")
            .expect("the file's key");
        assert!(blamed.contains("`polcy`"), "{blamed}");
        assert!(blamed.contains(&file.display().to_string()), "{blamed}");
        assert!(
            s.blame("invalid --lost-after: must be at least 1")
                .is_some()
        );
        // Not a flag of the file, or a longer flag that starts with one of its keys.
        assert!(s.blame("invalid --policy: `x` is not a policy").is_none());
        assert!(s.blame("invalid --lost-after-x: no").is_none());
        // Given on the command line too, the flag there is what the error is about.
        let s = args(&["--lost-after", "0"]);
        assert!(
            s.blame("invalid --lost-after: must be at least 1")
                .is_none()
        );
        // Only the error's own line: a usage line or a tip naming a key of the file is not
        // about the file (a typo on the command line, `--polcy x`, tips `--policy`).
        let typo = "error: unexpected argument '--lost-aftr' found\n\n  tip: a similar \
                    argument exists: '--lost-after'\n\nUsage: m --polcy <P>";
        assert!(args(&[]).blame(typo).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_file_says_what_to_fix() {
        assert!(flags("policy = ", |_| false).is_err());
        let e = flags("[section]\nx = 1\n", |_| false).unwrap_err();
        assert!(e.contains("`section` is a table"), "{e}");
        let e = flags("config = \"other.toml\"", |_| false).unwrap_err();
        assert!(e.contains("cannot name another"), "{e}");
    }
}
