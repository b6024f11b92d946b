//! The client side of `canopy web`: presents the operator's token to a running console
//! (`POST /link`, over loopback, in a header; over TLS when the console speaks it, trusting
//! exactly its configured certificate) and gets back a one-time login link. The token travels
//! only in that request's `Authorization` header, never in the link.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// Why no link came back.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The console could not be reached.
    #[error("the console at {url} is unreachable: {why}")]
    Unreachable { url: String, why: String },
    /// The console refused the token (not an operator's, or unknown).
    #[error("the console refused: {0}")]
    Refused(String),
}

/// Asks the console at `base` (`http://127.0.0.1:<port>`, or `https://` with `tls`, the
/// client configuration that trusts its certificate) for a login link for `token`.
pub async fn request_link(
    base: &str,
    token: &str,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<String, LinkError> {
    let unreachable = |why: String| LinkError::Unreachable { url: base.to_owned(), why };
    let (secure, rest) = match base.split_once("://") {
        Some(("https", rest)) => (true, rest),
        Some((_, rest)) => (false, rest),
        None => (false, base),
    };
    let authority = rest.trim_end_matches('/').to_owned();
    let stream = tokio::net::TcpStream::connect(&authority).await.map_err(|e| unreachable(e.to_string()))?;
    if let Err(e) = stream.set_nodelay(true) {
        // Only latency: the request still goes through.
        tracing::debug!(error = %e, "TCP_NODELAY on the connection to the console");
    }
    let (status, body) = match (secure, tls) {
        (false, _) => exchange(stream, &authority, token).await,
        (true, Some(config)) => {
            let host = authority.rsplit_once(':').map_or(authority.as_str(), |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| unreachable(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, stream).await;
            exchange(tls.map_err(|e| unreachable(format!("TLS: {e}")))?, &authority, token).await
        }
        (true, None) => return Err(unreachable("the console speaks HTTPS and no certificate was given".into())),
    }
    .map_err(unreachable)?;
    let value: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if !status.is_success() {
        let message = value["error"].as_str().unwrap_or("no reason given").to_owned();
        return Err(LinkError::Refused(message));
    }
    let path = value["path"].as_str().ok_or_else(|| LinkError::Refused("the console's answer named no link".into()))?;
    Ok(format!("{}{path}", base.trim_end_matches('/')))
}

/// `POST /link` over `stream`: the status and the body.
async fn exchange<S>(stream: S, authority: &str, token: &str) -> Result<(http::StatusCode, Bytes), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = http::Request::post("/link")
        .header(http::header::HOST, authority)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, body))
}
