//! TLS for [`crate::serve_router_tls`]: rustls (no OpenSSL), HTTP/2 and HTTP/1.1 chosen by
//! ALPN, and a certificate that is read again when its files change, so a renewed
//! certificate (certbot, cert-manager) is served without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// A server certificate and its key, from PEM files, with what serves them.
#[derive(Clone)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Current>,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The certificate served now (replaced when the files change).
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>, std::sync::atomic::AtomicBool);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// The certificate chain at `cert` and the private key at `key` (PEM), checked to belong
/// together.
fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain =
        std::fs::read(cert).map_err(|e| format!("read the certificate {}: {e}", cert.display()))?;
    let private =
        std::fs::read(key).map_err(|e| format!("read the private key {}: {e}", key.display()))?;
    parse(cert, &chain, key, &private)
}

/// The PEM certificate chain `chain` (from `cert`) and private key `private` (from
/// `key`), checked to belong together.
fn parse(cert: &Path, chain: &[u8], key: &Path, private: &[u8]) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("read the certificate {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "{} holds no certificate (PEM, BEGIN CERTIFICATE)",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(private)
        .map_err(|e| format!("read the private key {}: {e}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(private)
        .map_err(|e| format!("the private key {}: {e}", key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "the key {} does not belong to the certificate {}: {e}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(certified)
}

impl Tls {
    /// The certificate chain at `cert` and its private key at `key`, both PEM.
    ///
    /// # Errors
    /// A file that cannot be read or parsed, or a key that is not the certificate's.
    pub fn from_files(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<Tls, String> {
        let (cert, key) = (cert.into(), key.into());
        let current = Arc::new(Current(
            RwLock::new(Arc::new(certified_key(&cert, &key)?)),
            std::sync::atomic::AtomicBool::new(false),
        ));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            cert,
            key,
            current,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Reads the files again every `every` and serves what they hold from the next
    /// handshake on, once they change and check (a pair that does not, say a certificate
    /// renewed before its key, is reported and the one in force stays). Runs until the
    /// runtime ends.
    pub fn watch(&self, every: Duration) {
        // One watcher per certificate, however often this is called.
        if self
            .current
            .1
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let (cert, key, current) = (self.cert.clone(), self.key.clone(), self.current.clone());
        tokio::spawn(async move {
            let read = || (std::fs::read(&cert).ok(), std::fs::read(&key).ok());
            // What was last tried: a pair that did not check is tried again once either
            // file changes again (the other file may be on its way).
            let mut tried = read();
            loop {
                tokio::time::sleep(every).await;
                let now = read();
                if now == tried {
                    continue;
                }
                // The bytes compared are the bytes parsed.
                let parsed = match &now {
                    (Some(chain), Some(private)) => parse(&cert, chain, &key, private),
                    _ => Err(format!(
                        "read {} and {}: one of them is missing",
                        cert.display(),
                        key.display()
                    )),
                };
                tried = now;
                match parsed {
                    Ok(certified) => {
                        *current.0.write().unwrap_or_else(PoisonError::into_inner) =
                            Arc::new(certified);
                        tracing::info!(cert = %cert.display(), "TLS certificate read again: the files changed");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS files changed but do not check; the certificate in force stays")
                    }
                }
            }
        });
    }
}
