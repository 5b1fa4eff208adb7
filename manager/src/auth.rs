//! Who may call the control API: bearer tokens with a role, checked in one tower layer.
//!
//! Tokens come from a file (`--tokens`), one per line: `TOKEN ROLE NAME`, where ROLE is
//! `viewer` (GetJob, ListJobs, WatchEvents, ListWorkers, JobLogs: what Kubernetes' `view`
//! role reads, pod logs included) or `operator` (also SubmitJob, CancelJob, DrainWorker,
//! UndrainWorker, ForgetWorker, Backup); `#` starts a comment. A file rather than a database: a cluster has
//! a handful of callers, and the file is what a secret store mounts. Rotating a token is
//! writing the file again ([`TokensFile`]): the manager notices at the next call (one `stat`
//! a call) and reads it, as it does its TLS files; a file that cannot be used is logged and
//! the previous tokens kept until it changes again. Nothing restarts.
//!
//! [`AuthLayer`] wraps the whole server but only looks at `ControlService` calls: health and
//! reflection stay open for tooling (reflection reveals the API's schema, which is public in
//! this repository, and no data), and the agent stream is authenticated by its own means.
//! Every operator call, accepted or refused, is logged with the caller's name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use converge_messenger::tls::FileStamp;
use tonic::Status;
use tracing::{info, warn};

/// The service the layer guards.
const CONTROL: &str = "/converge.v1.ControlService/";

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read jobs, workers and events.
    Viewer,
    /// Also submit, cancel, drain, undrain and forget workers, and back up.
    Operator,
}

impl Role {
    fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// The role a ControlService method needs; a method not listed needs the highest.
pub fn required(method: &str) -> Role {
    match method {
        "GetJob" | "ListJobs" | "WatchEvents" | "ListWorkers" | "JobLogs" => Role::Viewer,
        _ => Role::Operator,
    }
}

/// A caller a token stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// Its name, for logs.
    pub name: String,
    /// What it may do.
    pub role: Role,
}

/// The authenticated caller's name, in a request's extensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallerName(pub String);

/// The tokens the manager accepts.
#[derive(Debug, Clone, Default)]
pub struct Tokens(HashMap<String, Caller>);

impl Tokens {
    /// Reads `path` (module doc for the format); errors name the line to fix.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut tokens = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let n = i + 1;
            let f: Vec<&str> = line.split_whitespace().collect();
            let [token, role, name] = f.as_slice() else {
                return Err(format!("line {n}: expected `TOKEN ROLE NAME`"));
            };
            if token.len() < 16 {
                return Err(format!(
                    "line {n}: the token of {name} is {} characters; use at least 16 (e.g. `openssl rand -hex 16`)",
                    token.len()
                ));
            }
            let role = Role::parse(role)
                .ok_or_else(|| format!("line {n}: role `{role}` is not `viewer` or `operator`"))?;
            let caller = Caller {
                name: name.to_string(),
                role,
            };
            if tokens.insert(token.to_string(), caller).is_some() {
                return Err(format!("line {n}: this token is given twice"));
            }
        }
        if tokens.is_empty() {
            return Err("no tokens: a file that admits nobody is a mistake".into());
        }
        Ok(Tokens(tokens))
    }

    /// Those of these tokens that `text` still holds (as a word of it), each with its role
    /// and name as they were: what a file that cannot be used leaves ([`TokensFile::current`]).
    fn still_in(&self, text: &str) -> Tokens {
        // Comments hold no token: one commented out is revoked.
        let words: std::collections::HashSet<&str> = (text.lines())
            .flat_map(|l| l.split('#').next().unwrap_or("").split_whitespace())
            .collect();
        let kept = (self.0.iter())
            .filter(|(token, _)| words.contains(token.as_str()))
            .map(|(token, caller)| (token.clone(), caller.clone()))
            .collect();
        Tokens(kept)
    }

    /// Who `authorization` (the header's value) is, or why it is refused.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<&Caller, Status> {
        let Some(value) = authorization else {
            return Err(Status::unauthenticated(
                "no `authorization` header: send `authorization: Bearer TOKEN` (grpcurl: -H 'authorization: Bearer TOKEN'; convergectl: --token or CONVERGE_TOKEN)",
            ));
        };
        // The scheme's name is case-insensitive (RFC 9110 §11.1): `bearer TOKEN` was refused.
        let value = value.trim();
        let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Status::unauthenticated(
                "the `authorization` header must be `Bearer TOKEN`",
            ));
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(Status::unauthenticated(
                "the bearer token is empty: set --token or CONVERGE_TOKEN to a token of the manager's tokens file",
            ));
        }
        self.0.get(token).ok_or_else(|| {
            Status::unauthenticated("the bearer token is not one this manager knows")
        })
    }
}

/// The tokens of a file, read again when it changes (module doc).
#[derive(Debug)]
pub struct TokensFile {
    path: PathBuf,
    read: Mutex<Read>,
}

/// The file as last seen, and the tokens last read from it that could be used.
#[derive(Debug)]
struct Read {
    stamp: FileStamp,
    tokens: Arc<Tokens>,
}

impl TokensFile {
    /// Reads `path`; fails as [`Tokens::load`] does, for a manager that must not start.
    pub fn open(path: &Path) -> Result<TokensFile, String> {
        // Stamped before reading, so that a change while reading is noticed at the next call.
        let stamp = FileStamp::of(path);
        let tokens = Arc::new(Tokens::load(path)?);
        Ok(TokensFile {
            path: path.to_path_buf(),
            read: Mutex::new(Read { stamp, tokens }),
        })
    }

    /// The tokens now: the file read again if it changed since it was last seen. A file that
    /// cannot be used still revokes: of the previous tokens, only those it still holds are
    /// kept (and the reason is logged, once). An operator who removes a leaked token and
    /// mistypes another line, or empties the file to shut everyone out, must not leave the
    /// leaked token working. A file that cannot be read at all keeps the previous tokens.
    pub fn current(&self) -> Arc<Tokens> {
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock: a caller with an older look must not write it back.
        let now = FileStamp::of(&self.path);
        if now != read.stamp {
            // Noted even when unusable: a file caught half-written is read again once it
            // changes again, not at every call.
            read.stamp = now;
            match std::fs::read_to_string(&self.path) {
                Err(e) => warn!(
                    path = %self.path.display(), error = %e,
                    "tokens file changed but cannot be read; keeping the previous tokens"
                ),
                Ok(text) => match Tokens::parse(&text) {
                    Ok(tokens) => {
                        info!(path = %self.path.display(), tokens = tokens.0.len(), "tokens file changed: calls are checked against it");
                        read.tokens = Arc::new(tokens);
                    }
                    Err(e) => {
                        let kept = read.tokens.still_in(&text);
                        warn!(
                            path = %self.path.display(), error = %e, kept = kept.0.len(),
                            "tokens file changed but cannot be used; keeping only the previous tokens it still holds"
                        );
                        read.tokens = Arc::new(kept);
                    }
                },
            }
        }
        read.tokens.clone()
    }
}

/// The tower layer that checks every ControlService call (module doc).
#[derive(Clone)]
pub struct AuthLayer {
    tokens: Arc<TokensFile>,
}

impl AuthLayer {
    /// Checks calls against the tokens of `file`, as it is at each call.
    pub fn new(file: TokensFile) -> Self {
        Self {
            tokens: Arc::new(file),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            tokens: self.tokens.clone(),
        }
    }
}

/// [`AuthLayer`]'s service.
#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    tokens: Arc<TokensFile>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(method) = req.uri().path().strip_prefix(CONTROL).map(str::to_string) else {
            return Box::pin(self.inner.call(req));
        };
        let header = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let need = required(&method);
        let tokens = self.tokens.current();
        let verdict = match tokens.authenticate(header) {
            Err(status) => Err((status, "unknown".to_string())),
            Ok(c) if c.role < need => Err((
                Status::permission_denied(format!(
                    "{method} needs the {} role; {} is a {}",
                    need.as_str(),
                    c.name,
                    c.role.as_str()
                )),
                c.name.clone(),
            )),
            Ok(c) => Ok(c.name.clone()),
        };
        match verdict {
            Ok(caller) => {
                if need == Role::Operator {
                    info!(%method, %caller, "operator call accepted");
                }
                let mut req = req;
                // The handlers count requests per caller (`control`).
                req.extensions_mut().insert(CallerName(caller));
                Box::pin(self.inner.call(req))
            }
            Err((status, caller)) => {
                warn!(%method, %caller, code = ?status.code(), reason = status.message(), "control call refused");
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# who may call\n\
        0123456789abcdef0123 viewer  grafana\n\
        fedcba9876543210fedc operator alice  # the on-call\n";

    #[test]
    fn a_token_file_names_callers_and_roles() {
        let t = Tokens::parse(FILE).unwrap();
        let alice = t.authenticate(Some("Bearer fedcba9876543210fedc")).unwrap();
        assert_eq!((alice.name.as_str(), alice.role), ("alice", Role::Operator));
        // The scheme in any case, as HTTP reads it.
        let again = t.authenticate(Some("bearer fedcba9876543210fedc")).unwrap();
        assert_eq!(again.name, "alice");
        for header in ["Bearer ", "Bearer"] {
            let empty = t.authenticate(Some(header)).unwrap_err();
            assert!(empty.message().contains("is empty"), "{}", empty.message());
        }
        assert_eq!(
            t.authenticate(None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            t.authenticate(Some("Bearer nope")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            t.authenticate(Some("0123456789abcdef0123"))
                .unwrap_err()
                .code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        for (text, want) in [
            ("short viewer x", "line 1: the token of x is 5 characters"),
            ("0123456789abcdef0123 admin x", "line 1: role `admin`"),
            (
                "0123456789abcdef0123 viewer",
                "line 1: expected `TOKEN ROLE NAME`",
            ),
            ("# nobody", "no tokens"),
        ] {
            let e = Tokens::parse(text).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    /// The documented rotation (`cargo xtask certs` writes a new tokens file, by rename):
    /// the next call is checked against the new file, with no restart; a file that cannot
    /// be used keeps the tokens before it, and one that can be used again is taken.
    #[tokio::test]
    async fn a_rewritten_tokens_file_is_taken_at_the_next_call() {
        use tower::{Layer, ServiceExt};
        let dir = std::env::temp_dir().join(format!("converge-tokens-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        let write = |text: &str| converge_messenger::tls::write_private(&path, text).unwrap();
        let (old, new, newer) = (
            "0123456789abcdef0old",
            "0123456789abcdef0new",
            "0123456789abcdefnewer",
        );
        write(&format!("{old} operator alice\n"));
        let layer = AuthLayer::new(TokensFile::open(&path).unwrap());
        // The code the layer answers with: none when the call reached the service.
        let call = |token: &str| {
            let service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }));
            let request = http::Request::builder()
                .uri(format!("{CONTROL}SubmitJob"))
                .header("authorization", format!("Bearer {token}"))
                .body(())
                .unwrap();
            async move {
                let response = service.oneshot(request).await.unwrap();
                response
                    .headers()
                    .get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_string())
            }
        };
        let unauthenticated = Some((tonic::Code::Unauthenticated as i32).to_string());
        assert_eq!(call(old).await, None);
        write(&format!("{new} operator alice\n"));
        assert_eq!(call(new).await, None, "the new token is refused");
        assert_eq!(
            call(old).await,
            unauthenticated,
            "the old token still passes"
        );
        // A leaked token removed, and another line mistyped: the file cannot be used, but
        // what it no longer holds is revoked all the same; what it holds still passes.
        let leaked = "0123456789abcdefleaked";
        write(&format!("{new} operator alice\n{leaked} operator bob\n"));
        assert_eq!(call(leaked).await, None);
        write(&format!("{new} operator alice\nshort operator carol\n"));
        assert_eq!(
            call(leaked).await,
            unauthenticated,
            "a removed token passes"
        );
        write(&format!("{new} operator alice\n{leaked} operator bob\n"));
        assert_eq!(call(leaked).await, None);
        write(&format!(
            "{new} operator alice\n# {leaked} operator bob\nbad line\n"
        ));
        assert_eq!(
            call(leaked).await,
            unauthenticated,
            "a token commented out passes"
        );
        assert_eq!(
            call(new).await,
            None,
            "a file that cannot be used dropped the tokens it holds"
        );
        // Emptied (to shut everyone out): nobody passes.
        write("# nobody\n");
        assert_eq!(call(new).await, unauthenticated);
        write(&format!("{newer} operator alice\n"));
        assert_eq!(
            call(newer).await,
            None,
            "a usable file after a bad one is not read"
        );
        assert_eq!(call(new).await, unauthenticated);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reads_need_a_viewer_and_changes_an_operator() {
        for m in [
            "GetJob",
            "ListJobs",
            "WatchEvents",
            "ListWorkers",
            "JobLogs",
        ] {
            assert_eq!(required(m), Role::Viewer);
        }
        for m in [
            "SubmitJob",
            "CancelJob",
            "DrainWorker",
            "UndrainWorker",
            "ForgetWorker",
            "Backup",
            "SomethingNew",
        ] {
            assert_eq!(required(m), Role::Operator);
        }
    }
}
