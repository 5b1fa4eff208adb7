//! Mutual TLS between agents and the manager (issue 15), with rustls through tonic.
//!
//! One cluster CA signs a manager certificate (server) and one client certificate per worker,
//! whose common name and DNS name are the worker id. The manager asks every TLS client for a
//! certificate from that CA but does not require one at the handshake, because users' tools
//! (grpcurl, convergectl) connect to the same port with bearer tokens instead; the agent stream
//! then refuses, before reading any message, a connection that presented none, and refuses a
//! `Register` for any worker other than the one its certificate names (as Kubernetes'
//! NodeRestriction ties a kubelet to its node). A certificate from another CA fails the
//! handshake.
//!
//! [`generate`] writes a CA and certificates for a testbed (`cargo xtask certs`).
//!
//! **Rotation without a restart.** Both sides read their files again when they change (their
//! modification times and sizes, [`Stamp`]): the manager's listener ([`listen`]) checks at each
//! new connection and hands new connections the new files, while open streams go on; an agent
//! ([`ClientTls`]) checks at each heartbeat and, when its files changed and make a usable
//! configuration, closes its stream gently (what it queued is sent first) and reconnects with
//! them, registering again with its running containers (as a kubelet reconnects when its
//! client certificate rotates). Files that cannot be used (one written, its key not yet) are
//! reported and the previous ones kept until the files change again: an agent's open stream
//! goes on, and a reconnect meanwhile uses the configuration of the last stream that
//! registered (`crate::agent`). Nothing is restarted: no process, no job.
//!
//! Files are written by a rename ([`write_public`], [`write_private`]), so a reader sees a
//! whole file, old or new; a process therefore sees a rotation only through the file's name,
//! which in a container means a mounted directory, not a bind mount of each file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tracing::{debug, info, warn};

/// Files of a cluster's certificates, as [`generate`] names them in one directory.
pub mod files {
    /// The CA certificate (every side trusts it).
    pub const CA: &str = "ca.pem";
    /// The CA's key (keep it off the machines; only [`super::generate`] needs it).
    pub const CA_KEY: &str = "ca.key";
    /// The manager's certificate and key.
    pub const MANAGER: (&str, &str) = ("manager.pem", "manager.key");
    /// A worker's certificate and key file names.
    pub fn worker(id: &str) -> (String, String) {
        (format!("{id}.pem"), format!("{id}.key"))
    }
}

/// Errors reading or making certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Generation failed.
    #[error("making certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// The files do not make a TLS configuration (not PEM, a key that does not match).
    #[error("{what}: {why}")]
    Invalid {
        /// Which file or part.
        what: String,
        /// Why.
        why: String,
    },
}

fn invalid(path: &Path, why: String) -> TlsError {
    TlsError::Invalid {
        what: path.display().to_string(),
        why,
    }
}

/// The certificates of a PEM file: at least one.
fn pem_certificates(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not PEM certificates ({e})")))?;
    if certs.is_empty() {
        return Err(invalid(path, "holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file.
fn pem_key(path: &Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, TlsError> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(read(path)?.as_bytes())
        .map_err(|e| invalid(path, format!("not a PEM private key ({e})")))
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// TLS set up on one side only, or a CA that did not sign the manager's certificate, as the
/// layers below say it: in their own words, somewhere in an error's causes, naming no setting.
/// Each client says what to change in its own flags ([`crate::agent::SessionError::hint`],
/// convergectl's hints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// A plaintext client read a TLS server's alert as an HTTP/2 frame. (It may also see only
    /// a broken pipe, depending on which side closes first.)
    TlsServer,
    /// A TLS client met a plaintext server.
    PlaintextServer,
    /// The manager's certificate is not signed by the CA the client trusts: a CA of another
    /// name (rustls' `UnknownIssuer`), or one of the same name with another key (its
    /// `BadSignature`), which is what a CA file left from before a rotation is (every
    /// testbed CA has the same name).
    UnknownIssuer,
}

impl Mismatch {
    /// The mismatch `error` or one of its causes speaks of, if any.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Option<Mismatch> {
        let mut cause = Some(error);
        let mut words = String::new();
        while let Some(c) = cause {
            words.push_str(&c.to_string());
            words.push('\n');
            cause = c.source();
        }
        if words.contains("frame with invalid size") {
            Some(Mismatch::TlsServer)
        } else if words.contains("InvalidContentType") {
            Some(Mismatch::PlaintextServer)
        } else if ["UnknownIssuer", "BadSignature"]
            .iter()
            .any(|w| words.contains(w))
        {
            Some(Mismatch::UnknownIssuer)
        } else {
            None
        }
    }
}

/// Writes a secret (a private key, a tokens file) readable by its owner only: a new file,
/// made so before the text goes in, then renamed over the old one. Not written into the old
/// file: a reader that opened it when it was readable by all would read the new secret.
pub fn write_private(path: &Path, text: &str) -> Result<(), TlsError> {
    write_atomic(path, text, 0o600)
}

/// Writes a public file (a certificate) as [`write_private`] writes a secret: a reader sees
/// the old text or the new, never half of it (a key read half-written, or a certificate
/// ahead of its key, is only refused and tried again when the files change again; a file
/// truncated and written in place could be read between the two and look unchanged since).
/// So a reader must open the file by its name each time: a bind mount of the file alone
/// (`docker run -v a/ca.pem:/certs/ca.pem`) keeps the old one; mount its directory.
pub fn write_public(path: &Path, text: &str) -> Result<(), TlsError> {
    write_atomic(path, text, 0o644)
}

fn write_atomic(path: &Path, text: &str, mode: u32) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut new = path.as_os_str().to_owned();
    new.push(".new");
    let new = PathBuf::from(new);
    // A `.new` left by a write that failed halfway is ours to replace.
    let _ = std::fs::remove_file(&new);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&new)
        .map_err(io)?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&new, path))
        .map_err(io)
}

/// PEM files of one side: its certificate and key, and the CA it trusts.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    /// The CA certificate.
    pub ca: PathBuf,
    /// This side's certificate.
    pub cert: PathBuf,
    /// This side's key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The three `--tls-*` settings of a binary: all three, or none (plaintext).
    pub fn from_settings(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, &'static str> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { ca, cert, key })),
            _ => Err(
                "--tls-cert, --tls-key and --tls-ca go together: give all three, or none for plaintext",
            ),
        }
    }

    /// Worker `id`'s files in `dir`, as [`generate`] names them.
    pub fn worker(dir: &Path, id: &str) -> Self {
        let (cert, key) = files::worker(id);
        TlsFiles {
            ca: dir.join(files::CA),
            cert: dir.join(cert),
            key: dir.join(key),
        }
    }

    /// The manager's files in `dir`, as [`generate`] names them.
    pub fn manager(dir: &Path) -> Self {
        TlsFiles {
            ca: dir.join(files::CA),
            cert: dir.join(files::MANAGER.0),
            key: dir.join(files::MANAGER.1),
        }
    }

    /// When the three files last changed, to notice a rotation.
    pub fn stamp(&self) -> Stamp {
        Stamp([
            FileStamp::of(&self.ca),
            FileStamp::of(&self.cert),
            FileStamp::of(&self.key),
        ])
    }

    /// The manager's TLS: its identity; client certificates asked for, from the CA, but not
    /// required at the handshake (module doc); HTTP/2 by ALPN, as gRPC clients expect.
    pub fn server(&self) -> Result<rustls::ServerConfig, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in pem_certificates(&self.ca)? {
            roots
                .add(ca)
                .map_err(|e| invalid(&self.ca, format!("not a CA certificate ({e})")))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(roots.into())
            .allow_unauthenticated()
            .build()
            .map_err(|e| invalid(&self.ca, e.to_string()))?;
        let mut config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(pem_certificates(&self.cert)?, pem_key(&self.key)?)
            .map_err(|e| invalid(&self.cert, format!("does not go with its key ({e})")))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// Which of the three settings (`tls-ca`, `tls-cert`, `tls-key`) gave the file `e` is
    /// about, so that a message names the flag to fix; `tls-cert` when it names none of them.
    pub fn setting_of(&self, e: &TlsError) -> &'static str {
        let named = match e {
            TlsError::Io { path, .. } => path.as_path(),
            TlsError::Invalid { what, .. } => Path::new(what.as_str()),
            TlsError::Generate(_) => return "tls-cert",
        };
        // The certificate first: one file given as both certificate and key is named so.
        if named == self.cert {
            "tls-cert"
        } else if named == self.key {
            "tls-key"
        } else if named == self.ca {
            "tls-ca"
        } else {
            "tls-cert"
        }
    }

    /// An agent's TLS: its worker certificate, trusting the CA for the manager's.
    pub fn client(&self, domain: &str) -> Result<ClientTlsConfig, TlsError> {
        // tonic takes the PEM text and, at the handshake, says only that it was bad (or skips
        // a CA that is not PEM, and then trusts nothing): parsed here, a bad file is named.
        pem_certificates(&self.ca)?;
        let (chain, key) = (pem_certificates(&self.cert)?, pem_key(&self.key)?);
        // A key of another certificate fails only at the handshake, as "transport error".
        let provider = rustls::crypto::ring::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
            invalid(
                &self.key,
                format!(
                    "does not go with the certificate {} ({e})",
                    self.cert.display()
                ),
            )
        })?;
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca)?))
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?))
            .domain_name(domain))
    }
}

/// The [`FileStamp`]s of a side's three files: when it differs from the last one read, the
/// files were rotated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp([FileStamp; 3]);

/// What tells a file's versions apart without reading it: its inode (a file renamed over it
/// is another, even written within the same clock tick at the same size), modification time
/// and size; all `None` for a file that is missing. One `stat`, cheap enough for every call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp(Option<(u64, SystemTime, u64)>);

impl FileStamp {
    /// `path`'s stamp now.
    pub fn of(path: &Path) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp(std::fs::metadata(path).ok().map(|m| {
            (
                m.ino(),
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
            )
        }))
    }
}

/// An agent's TLS, read from its files at each connection (module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientTls {
    /// The files.
    pub files: TlsFiles,
    /// The name the manager's certificate must carry.
    pub domain: String,
}

impl ClientTls {
    /// `endpoint` with the TLS the files make now, checked as a connection will use it (a
    /// file that is not PEM is refused here, not at the handshake), and the files' stamp.
    pub fn endpoint(
        &self,
        endpoint: tonic::transport::Endpoint,
    ) -> Result<(tonic::transport::Endpoint, Stamp), TlsError> {
        let (config, stamp) = self.config();
        Ok((self.with(endpoint, config?)?, stamp))
    }

    /// The TLS the files make now, and their stamp, taken before reading them (so that a
    /// change while reading is noticed next time), also when they cannot be used.
    pub fn config(&self) -> (Result<ClientTlsConfig, TlsError>, Stamp) {
        let stamp = self.files.stamp();
        (self.files.client(&self.domain), stamp)
    }

    /// `endpoint` with `config` (one [`ClientTls::config`] made, now or before).
    pub fn with(
        &self,
        endpoint: tonic::transport::Endpoint,
        config: ClientTlsConfig,
    ) -> Result<tonic::transport::Endpoint, TlsError> {
        endpoint.tls_config(config).map_err(|e| TlsError::Invalid {
            what: self.files.cert.display().to_string(),
            why: e.to_string(),
        })
    }

    /// Whether the files make a usable TLS for a connection to `manager` (a URL).
    pub fn check(&self, manager: &str) -> Result<(), TlsError> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(manager.to_string()).map_err(|e| {
                TlsError::Invalid {
                    what: manager.to_string(),
                    why: e.to_string(),
                }
            })?;
        self.endpoint(endpoint).map(|_| ())
    }

    /// Whether the files changed since `stamp`.
    pub fn changed(&self, stamp: &Stamp) -> bool {
        self.files.stamp() != *stamp
    }
}

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The manager's TLS connections: accepts on `listener` until `shutdown` and completes each
/// handshake with `files` as they are at that connection (module doc), in a task of its own
/// so that a slow client holds up nobody. A handshake that fails (no common CA, a timeout) is
/// logged and the connection dropped. Fails at once when the files do not make a
/// configuration.
pub fn listen(
    listener: TcpListener,
    files: TlsFiles,
    shutdown: CancellationToken,
) -> Result<ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>>, TlsError> {
    let mut stamp = files.stamp();
    let mut config = Arc::new(files.server()?);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        // Handshakes in flight end with the loop (dropping the set aborts them).
        let mut handshakes = tokio::task::JoinSet::new();
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                // The server stopped reading connections (it ended or failed): stop
                // accepting, so the port closes as it did with tonic's own listener.
                _ = tx.closed() => return,
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::Interrupted
                    ) => continue,
                    Err(e) => {
                        // Out of descriptors or memory: wait rather than spin.
                        warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let now = files.stamp();
            if now != stamp {
                // Noted even when unusable: a half-written rotation is tried again when the
                // files change again, not at every connection.
                stamp = now;
                match files.server() {
                    Ok(c) => {
                        config = Arc::new(c);
                        info!(cert = %files.cert.display(), "certificate files changed: new connections use them");
                    }
                    Err(e) => {
                        warn!(error = %e, "certificate files changed but cannot be used; keeping the previous ones");
                    }
                }
            }
            let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
            let tx = tx.clone();
            handshakes.spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// A client of the control API over TLS with no certificate of its own (it trusts `ca`).
pub fn control_client(ca: &Path, domain: &str) -> Result<ClientTlsConfig, TlsError> {
    // As in `TlsFiles::client`: a CA file that is not PEM is named now, not met as an
    // unknown issuer at the handshake.
    pem_certificates(ca)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)?))
        .domain_name(domain))
}

/// The names a client certificate (DER) stands for: its common name and DNS names. Empty
/// when it cannot be parsed.
pub fn names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut out: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                out.push(d.to_string());
            }
        }
    }
    out
}

/// A new cluster's CA and certificates, as PEM text, before they are written anywhere.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The CA certificate.
    pub ca: String,
    /// The CA's key.
    pub ca_key: String,
    /// The manager's certificate and key.
    pub manager: (String, String),
    /// Each worker's id, certificate and key.
    pub workers: Vec<(String, String, String)>,
}

impl Credentials {
    /// A new cluster CA, a manager certificate valid for `manager_names` (host names or IP
    /// addresses) and one client certificate per worker id.
    pub fn new(manager_names: &[String], workers: &[String]) -> Result<Credentials, TlsError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "Converge cluster CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let (ca_pem, ca_key_pem) = (ca_cert.pem(), ca_key.serialize_pem());
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |cn: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let mut p = CertificateParams::new(sans)?;
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = p.signed_by(&key, &issuer)?;
            Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
        };
        let manager = leaf(
            "converge-manager",
            manager_names.to_vec(),
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let workers = workers
            .iter()
            .map(|w| {
                let (cert, key) = leaf(w, vec![w.clone()], ExtendedKeyUsagePurpose::ClientAuth)?;
                Ok((w.clone(), cert, key))
            })
            .collect::<Result<_, rcgen::Error>>()?;
        Ok(Credentials {
            ca: ca_pem,
            ca_key: ca_key_pem,
            manager,
            workers,
        })
    }

    /// Writes the CA's certificate into `dir`, and the manager's files (`manager`) or one
    /// worker's (`Some(id)`), as [`TlsFiles::manager`] and [`TlsFiles::worker`] name them:
    /// the CA first, each key after its certificate, so that a reader that sees a key sees
    /// its certificate too (module doc). Fails for a worker it has no certificate for.
    pub fn write_side(&self, dir: &Path, worker: Option<&str>) -> Result<(), TlsError> {
        let ((cert_name, key_name), (cert, key)) = match worker {
            None => (
                (files::MANAGER.0.to_string(), files::MANAGER.1.to_string()),
                (&self.manager.0, &self.manager.1),
            ),
            Some(id) => {
                let (_, cert, key) =
                    self.workers.iter().find(|(w, ..)| w == id).ok_or_else(|| {
                        TlsError::Invalid {
                            what: id.to_string(),
                            why: "no certificate was made for this worker".into(),
                        }
                    })?;
                (files::worker(id), (cert, key))
            }
        };
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        write_public(&dir.join(files::CA), &self.ca)?;
        write_public(&dir.join(cert_name), cert)?;
        write_private(&dir.join(key_name), key)
    }
}

/// Writes a new cluster CA into `dir`, a manager certificate valid for `manager_names`
/// (host names or IP addresses) and one client certificate per worker id ([`Credentials`]),
/// all in one directory. Existing files are replaced (that is a rotation).
pub fn generate(dir: &Path, manager_names: &[String], workers: &[String]) -> Result<(), TlsError> {
    let made = Credentials::new(manager_names, workers)?;
    made.write_side(dir, None)?;
    write_private(&dir.join(files::CA_KEY), &made.ca_key)?;
    for w in workers {
        made.write_side(dir, Some(w))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_certificate_names_its_worker() {
        let dir = std::env::temp_dir().join(format!("converge-tls-{}", uuid::Uuid::new_v4()));
        generate(&dir, &["localhost".into()], &["worker-7".into()]).unwrap();
        let pem = std::fs::read_to_string(dir.join("worker-7.pem")).unwrap();
        let der = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .unwrap()
            .1
            .contents;
        assert_eq!(
            names(&der),
            vec!["worker-7".to_string(), "worker-7".to_string()]
        );
        assert!(names(b"not a certificate").is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Keys are readable by their owner only, also when written over a file that was not
    /// (what `cargo xtask certs` does again to rotate them); certificates are public.
    #[test]
    fn keys_are_written_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("converge-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let (w1_cert, w1_key) = files::worker("w1");
        std::fs::write(dir.join(&w1_key), "old").unwrap();
        std::fs::set_permissions(dir.join(&w1_key), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        generate(&dir, &["localhost".into()], &["w1".into()]).unwrap();
        let mode = |f: &str| std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
        for key in [files::CA_KEY, files::MANAGER.1, &w1_key] {
            assert_eq!(mode(key), 0o600, "{key}");
        }
        assert_eq!(mode(&w1_cert) & 0o044, 0o044, "certificates stay readable");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A worker's key with another worker's certificate is named as the key to fix, at the
    /// start rather than as a transport error at every connection.
    #[test]
    fn a_key_of_another_certificate_is_named() {
        let dir = std::env::temp_dir().join(format!("converge-tls-{}", uuid::Uuid::new_v4()));
        generate(&dir, &["localhost".into()], &["w1".into(), "w2".into()]).unwrap();
        let mut files = TlsFiles::worker(&dir, "w1");
        files.client("localhost").expect("its own key");
        files.key = TlsFiles::worker(&dir, "w2").key;
        let e = files.client("localhost").map(|_| ()).unwrap_err();
        assert_eq!(files.setting_of(&e), "tls-key", "{e}");
        assert!(
            e.to_string().contains("does not go with the certificate"),
            "{e}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Each of the three files, missing or not PEM, is named with the setting that gave it,
    /// on the agent's side and on the manager's (tonic alone would say "bad PEM", or skip a
    /// CA that is not PEM and trust nothing).
    #[test]
    fn a_file_that_cannot_be_used_is_named_with_its_setting() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = std::env::temp_dir().join(format!("converge-tls-{}", uuid::Uuid::new_v4()));
        generate(&dir, &["localhost".into()], &["w1".into()]).unwrap();
        fn ca(f: &mut TlsFiles) -> &mut PathBuf {
            &mut f.ca
        }
        fn cert(f: &mut TlsFiles) -> &mut PathBuf {
            &mut f.cert
        }
        fn key(f: &mut TlsFiles) -> &mut PathBuf {
            &mut f.key
        }
        type File = fn(&mut TlsFiles) -> &mut PathBuf;
        let cases: [(&str, File); 3] = [("tls-ca", ca), ("tls-cert", cert), ("tls-key", key)];
        let not_pem = dir.join("not-pem");
        std::fs::write(&not_pem, "not PEM\n").unwrap();
        for (setting, file) in cases {
            for side in [TlsFiles::worker(&dir, "w1"), TlsFiles::manager(&dir)] {
                for bad in [dir.join("missing"), not_pem.clone()] {
                    let mut files = side.clone();
                    *file(&mut files) = bad.clone();
                    let e = if side == TlsFiles::manager(&dir) {
                        files.server().map(|_| ()).unwrap_err()
                    } else {
                        files.client("localhost").map(|_| ()).unwrap_err()
                    };
                    assert_eq!(files.setting_of(&e), setting, "{e}");
                    assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
                }
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
