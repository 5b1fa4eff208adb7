//! Who may call the control API: bearer tokens with a role, checked in one tower layer.
//!
//! Tokens come from a file (`--tokens`), one per line: `TOKEN ROLE NAME`, where ROLE is
//! `viewer` (GetJob, ListJobs, WatchEvents, ListWorkers, JobLogs: what Kubernetes' `view`
//! role reads, pod logs included) or `operator` (also SubmitJob, CancelJob, DrainWorker,
//! UndrainWorker, ForgetWorker, Backup); `#` starts a comment. A file rather than a database: a cluster has
//! a handful of callers, the file is what a secret store mounts, and rotating a token is
//! editing a line and restarting the manager (jobs run on meanwhile).
//!
//! [`AuthLayer`] wraps the whole server but only looks at `ControlService` calls: health and
//! reflection stay open for tooling (reflection reveals the API's schema, which is public in
//! this repository, and no data), and the agent stream is authenticated by its own means.
//! Every operator call, accepted or refused, is logged with the caller's name.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

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

    /// Who `authorization` (the header's value) is, or why it is refused.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<&Caller, Status> {
        let Some(value) = authorization else {
            return Err(Status::unauthenticated(
                "no `authorization` header: send `authorization: Bearer TOKEN` (grpcurl: -H 'authorization: Bearer TOKEN'; convergectl: --token or CONVERGE_TOKEN)",
            ));
        };
        let Some(token) = value.strip_prefix("Bearer ") else {
            return Err(Status::unauthenticated(
                "the `authorization` header must be `Bearer TOKEN`",
            ));
        };
        self.0.get(token.trim()).ok_or_else(|| {
            Status::unauthenticated("the bearer token is not one this manager knows")
        })
    }
}

/// The tower layer that checks every ControlService call (module doc).
#[derive(Clone)]
pub struct AuthLayer {
    tokens: Arc<Tokens>,
}

impl AuthLayer {
    /// Checks calls against `tokens`.
    pub fn new(tokens: Tokens) -> Self {
        Self {
            tokens: Arc::new(tokens),
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
    tokens: Arc<Tokens>,
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
        let verdict = match self.tokens.authenticate(header) {
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
