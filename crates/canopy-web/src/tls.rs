//! The console's TLS: the server configuration from `[web] tls_cert`/`tls_key`, a self-signed
//! pair made by `canopy web --init-tls` with the fingerprint the operator checks, the names a
//! certificate is good for (the `Host` check of a console reached by name), and the client
//! configuration `canopy web` uses to reach its own console: it trusts exactly the configured
//! certificate, whatever names it carries. Does not listen or accept (`listener.rs` does).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

/// What `init` made.
#[derive(Debug, Clone)]
pub struct Made {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// SHA-256 of the certificate, `AB:CD:…`, as browsers show it.
    pub fingerprint: String,
    /// The names and addresses it is good for.
    pub names: Vec<String>,
}

/// The certificate and key files `init` writes in the console's directory.
pub fn generated_paths(web_dir: &Path) -> (PathBuf, PathBuf) {
    (web_dir.join("tls").join("cert.pem"), web_dir.join("tls").join("key.pem"))
}

/// Makes a self-signed certificate (ECDSA P-256) for `localhost`, the loopback addresses, this
/// machine's host name and `names`, valid from yesterday for 825 days, and
/// writes it and its key (0600) under `web_dir/tls/`. Refuses to replace a pair unless `force`.
pub fn init(web_dir: &Path, names: &[String], force: bool) -> Result<Made, String> {
    let (cert_path, key_path) = generated_paths(web_dir);
    if !force && cert_path.exists() {
        let existing = load_chain(&cert_path)?;
        let print = existing.first().map(|c| fingerprint(c)).unwrap_or_default();
        return Err(format!(
            "{} exists already (SHA-256 {print}); `--force` makes a new pair, and browsers that trusted this one must \
             be told again",
            cert_path.display()
        ));
    }
    let mut all: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if let Some(host) = std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned())
        && !host.is_empty()
    {
        all.push(host);
    }
    for name in names {
        check_name(name)?;
        all.push(name.clone());
    }
    all.dedup();
    let mut params = rcgen::CertificateParams::new(all.clone()).map_err(|e| format!("the certificate's names: {e}"))?;
    // From yesterday (clocks differ a little) for 825 days, the longest Apple's platforms
    // accept for a server certificate, and marked for server authentication, which they require.
    let today = canopy_sys::unix_ms().div_euclid(86_400_000);
    let day = |days: i64| {
        let (y, m, d) = civil(days);
        rcgen::date_time_ymd(y, m, d)
    };
    params.not_before = day(today - 1);
    params.not_after = day(today + 825);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.distinguished_name.push(rcgen::DnType::CommonName, "Canopy console");
    let key = rcgen::KeyPair::generate().map_err(|e| format!("making a key: {e}"))?;
    let cert = params.self_signed(&key).map_err(|e| format!("signing the certificate: {e}"))?;
    let dir = cert_path.parent().unwrap_or(web_dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    canopy_sys::write_private(&key_path, key.serialize_pem().as_bytes())
        .map_err(|e| format!("{}: {e}", key_path.display()))?;
    canopy_sys::write_private(&cert_path, cert.pem().as_bytes())
        .map_err(|e| format!("{}: {e}", cert_path.display()))?;
    Ok(Made { cert: cert_path, key: key_path, fingerprint: fingerprint(cert.der()), names: all })
}

/// The UTC date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (i32::try_from(y).unwrap_or(1970), m, d)
}

/// A name a certificate may carry: a DNS name or an IP address.
fn check_name(name: &str) -> Result<(), String> {
    match ServerName::try_from(name) {
        Ok(_) => Ok(()),
        Err(_) => Err(format!("--name {name:?} is neither a host name nor an IP address")),
    }
}

/// SHA-256 of a certificate's DER, as `AB:CD:…`.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der).iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

fn load_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: holds no certificate", path.display()));
    }
    Ok(chain)
}

/// A loaded certificate: the server's configuration, and the leaf for the `Host` check.
pub struct Served {
    pub config: Arc<rustls::ServerConfig>,
    pub leaf: CertificateDer<'static>,
}

/// The server configuration for `cert` (a PEM chain, leaf first) and `key`.
pub fn server(cert: &Path, key: &Path) -> Result<Served, String> {
    let chain = load_chain(cert)?;
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: not a PEM private key: {e}", key.display()))?;
    let leaf = chain[0].clone();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and its key: {e}", cert.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Served { config: Arc::new(config), leaf })
}

/// Whether the certificate `leaf` is good for `host` (a name or an address, no port).
pub fn names(leaf: &CertificateDer<'_>, host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let (Ok(cert), Ok(name)) = (webpki::EndEntityCert::try_from(leaf), ServerName::try_from(host)) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// A client configuration that accepts exactly the certificate in `cert` (its leaf), whatever
/// name it is reached by: `canopy web` asking its own console for a link over loopback.
pub fn pinned_client(cert: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let leaf = load_chain(cert)?.swap_remove(0);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(Pinned { leaf, provider: provider.clone() });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Trusts one certificate, byte for byte; the handshake's signatures are still checked.
#[derive(Debug)]
struct Pinned {
    leaf: CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match end_entity.as_ref() == self.leaf.as_ref() {
            true => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            false => {
                Err(rustls::Error::General("the console presented another certificate than [web] tls_cert".into()))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn days_since_the_epoch_are_dates() {
        assert_eq!(super::civil(0), (1970, 1, 1));
        assert_eq!(super::civil(19_722), (2023, 12, 31));
        assert_eq!(super::civil(19_782), (2024, 2, 29));
        assert_eq!(super::civil(20_792), (2026, 12, 5));
    }
}
