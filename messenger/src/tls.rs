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
//! [`generate`] writes a CA and certificates for a testbed (`cargo xtask certs`); rotate by
//! writing new files and restarting the process that uses them (agents re-adopt their running
//! containers; the manager recovers from its store).

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

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
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, text: &str) -> Result<(), TlsError> {
    std::fs::write(path, text).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
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

    /// The manager's TLS: its identity; client certificates asked for, from the CA.
    pub fn server(&self) -> Result<ServerTlsConfig, TlsError> {
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?))
            .client_ca_root(Certificate::from_pem(read(&self.ca)?))
            .client_auth_optional(true))
    }

    /// An agent's TLS: its worker certificate, trusting the CA for the manager's.
    pub fn client(&self, domain: &str) -> Result<ClientTlsConfig, TlsError> {
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca)?))
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?))
            .domain_name(domain))
    }
}

/// A client of the control API over TLS with no certificate of its own (it trusts `ca`).
pub fn control_client(ca: &Path, domain: &str) -> Result<ClientTlsConfig, TlsError> {
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

/// Writes a new cluster CA into `dir`, a manager certificate valid for `manager_names`
/// (host names or IP addresses) and one client certificate per worker id. Existing files
/// are overwritten (that is a rotation).
pub fn generate(dir: &Path, manager_names: &[String], workers: &[String]) -> Result<(), TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
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
    write(&dir.join(files::CA), &ca_cert.pem())?;
    write(&dir.join(files::CA_KEY), &ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |cn: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &issuer)?;
        Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
    };
    let (cert, key) = leaf(
        "converge-manager",
        manager_names.to_vec(),
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    write(&dir.join(files::MANAGER.0), &cert)?;
    write(&dir.join(files::MANAGER.1), &key)?;
    for w in workers {
        let (cert, key) = leaf(w, vec![w.clone()], ExtendedKeyUsagePurpose::ClientAuth)?;
        let (c, k) = files::worker(w);
        write(&dir.join(c), &cert)?;
        write(&dir.join(k), &key)?;
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
}
