//! TLS for mail: one rustls client configuration per account — the
//! account's CA file when it has one (a self-hosted server), the public
//! roots otherwise; certificate and host name checks always on.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::config::EmailConfig;

/// The CA certificates of the account's `ca_file` (PEM), if it has one.
pub fn ca_certs(cfg: &EmailConfig) -> Result<Option<Vec<CertificateDer<'static>>>, String> {
    let Some(path) = &cfg.ca_file else { return Ok(None) };
    let pem = std::fs::read(path).map_err(|e| format!("the account's CA file {}: {e}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the account's CA file {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("the account's CA file {} holds no certificate", path.display()));
    }
    Ok(Some(certs))
}

/// A rustls client configuration for the account.
pub fn client_config(cfg: &EmailConfig) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_certs(cfg)? {
        Some(certs) => {
            for c in certs {
                roots.add(c).map_err(|e| format!("the account's CA file: {e}"))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// lettre's TLS parameters for the account's SMTP server.
pub fn smtp_parameters(cfg: &EmailConfig) -> Result<lettre::transport::smtp::client::TlsParameters, String> {
    use lettre::transport::smtp::client::{Certificate, CertificateStore, TlsParameters};
    let mut b = TlsParameters::builder(cfg.smtp.host.clone());
    if let Some(certs) = ca_certs(cfg)? {
        b = b.certificate_store(CertificateStore::None);
        for c in certs {
            b = b.add_root_certificate(Certificate::from_der(c.to_vec()).map_err(|e| e.to_string())?);
        }
    }
    b.build_rustls().map_err(|e| e.to_string())
}
