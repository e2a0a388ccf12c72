//! TLS settings for `rediss://` URLs (rustls with the ring provider).

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, ErrorKind, Result};
use crate::url::Tls;

/// Largest CA certificate file read (a bundle of a few hundred certificates fits).
pub(crate) const MAX_CA_FILE: u64 = 4 << 20;

/// How a client's connections set up TLS; the rustls configuration is built on first use
/// (loading the system's roots reads many files) and shared by every connection.
pub(crate) struct TlsSetup {
    mode: Tls,
    ca_pem: Option<Vec<u8>>,
    config: OnceLock<std::result::Result<Arc<ClientConfig>, String>>,
}

impl TlsSetup {
    pub fn new(mode: Tls, ca_pem: Option<Vec<u8>>) -> Result<Self> {
        if let Some(pem) = &ca_pem {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::invalid(format!("the CA certificate is not valid PEM: {e}")))?;
            if certs.is_empty() {
                return Err(Error::invalid(
                    "the CA certificate file holds no certificate",
                ));
            }
        }
        Ok(TlsSetup {
            mode,
            ca_pem,
            config: OnceLock::new(),
        })
    }

    pub fn mode(&self) -> Tls {
        self.mode
    }

    /// The shared rustls configuration.
    pub fn config(&self) -> Result<Arc<ClientConfig>> {
        self.config
            .get_or_init(|| self.build())
            .clone()
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))
    }

    fn build(&self) -> std::result::Result<Arc<ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?;
        let config = if self.mode == Tls::Insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                .with_no_client_auth()
        } else {
            let mut roots = RootCertStore::empty();
            match &self.ca_pem {
                Some(pem) => {
                    for cert in CertificateDer::pem_slice_iter(pem) {
                        let cert = cert.map_err(|e| format!("bad CA certificate: {e}"))?;
                        roots
                            .add(cert)
                            .map_err(|e| format!("bad CA certificate: {e}"))?;
                    }
                }
                None => {
                    let found = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(found.certs);
                    if roots.is_empty() {
                        return Err("no system CA certificates found; give a CA certificate".into());
                    }
                }
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        Ok(Arc::new(config))
    }
}

/// The name to check the server certificate against.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned())
        .map_err(|e| Error::invalid(format!("{host:?} is not a valid TLS server name: {e}")))
}

/// `#insecure`: encrypts, but accepts any certificate (signatures are still checked, so the
/// handshake itself is sound).
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
