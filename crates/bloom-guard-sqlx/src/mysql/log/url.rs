//! The binary log stream's connection settings, from the database's URL
//! as sqlx reads it: host, port, user, password, database, a Unix socket,
//! and TLS by `ssl-mode` (`DISABLED`, `PREFERRED` the default, `REQUIRED`,
//! `VERIFY_CA`, `VERIFY_IDENTITY`), `ssl-ca`, `ssl-cert` and `ssl-key`.
//!
//! TLS needs the feature `binlog-feed-tls` (rustls). Without it a URL that
//! requires TLS is an error rather than a stream in the clear, and
//! `PREFERRED` streams without.

use super::error::BinlogError;

/// How the stream's connection uses TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// `DISABLED`.
    Off,
    /// `PREFERRED`: TLS if the server offers it, unverified, as sqlx.
    Preferred,
    /// `REQUIRED`: TLS, the server's certificate unverified.
    Required,
    /// `VERIFY_CA`: TLS, the certificate's chain verified, not its name.
    VerifyCa,
    /// `VERIFY_IDENTITY`: TLS, the chain and the host name verified.
    VerifyIdentity,
}

impl TlsMode {
    fn parse(mode: &str) -> Result<Self, BinlogError> {
        match mode.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" | "DISABLE" => Ok(Self::Off),
            "PREFERRED" | "PREFER" => Ok(Self::Preferred),
            "REQUIRED" | "REQUIRE" => Ok(Self::Required),
            "VERIFY_CA" => Ok(Self::VerifyCa),
            "VERIFY_IDENTITY" | "VERIFY_FULL" => Ok(Self::VerifyIdentity),
            other => Err(BinlogError::Url(format!(
                "ssl-mode={other} is not a TLS mode"
            ))),
        }
    }
}

/// The stream's connection: its options, and whether to try it over TLS
/// first (`PREFERRED`).
#[derive(Debug, Clone)]
pub(crate) struct StreamOptions {
    plain: mysql_async::OptsBuilder,
    tls: Option<mysql_async::OptsBuilder>,
    mode: TlsMode,
}

impl StreamOptions {
    /// The options to connect with, in the order to try them.
    pub(crate) fn attempts(&self) -> Vec<mysql_async::Opts> {
        match (self.mode, &self.tls) {
            (TlsMode::Off, _) | (_, None) => vec![self.plain.clone().into()],
            (TlsMode::Preferred, Some(tls)) => vec![tls.clone().into(), self.plain.clone().into()],
            (_, Some(tls)) => vec![tls.clone().into()],
        }
    }
}

/// The stream's connection options for `url` (`mysql://` or `mariadb://`).
pub(crate) fn options(url: &str) -> Result<StreamOptions, BinlogError> {
    let parsed = url::Url::parse(url).map_err(|error| BinlogError::Url(error.to_string()))?;
    if !matches!(parsed.scheme(), "mysql" | "mariadb") {
        return Err(BinlogError::Url(format!(
            "the scheme {} is not mysql:// or mariadb://",
            parsed.scheme()
        )));
    }
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|error| BinlogError::Url(error.to_string()))
    };
    let mut plain = mysql_async::OptsBuilder::default()
        .ip_or_hostname(parsed.host_str().unwrap_or("localhost").to_owned())
        .tcp_port(parsed.port().unwrap_or(3306))
        .user(Some(decode(parsed.username())?))
        .pass(parsed.password().map(decode).transpose()?)
        .db_name(Some(decode(parsed.path().trim_start_matches('/'))?).filter(|db| !db.is_empty()));
    let mut mode = TlsMode::Preferred;
    let (mut ca, mut cert, mut key) = (None, None, None);
    for (name, value) in parsed.query_pairs() {
        match name.as_ref() {
            "socket" => plain = plain.socket(Some(value.into_owned())),
            "ssl-mode" | "sslmode" => mode = TlsMode::parse(&value)?,
            "ssl-ca" | "sslrootcert" => ca = Some(value.into_owned()),
            "ssl-cert" | "sslcert" => cert = Some(value.into_owned()),
            "ssl-key" | "sslkey" => key = Some(value.into_owned()),
            _ => {}
        }
    }
    let tls = tls_options(&plain, mode, ca, cert.zip(key))?;
    Ok(StreamOptions { plain, tls, mode })
}

#[cfg(feature = "binlog-feed-tls")]
fn tls_options(
    plain: &mysql_async::OptsBuilder,
    mode: TlsMode,
    ca: Option<String>,
    identity: Option<(String, String)>,
) -> Result<Option<mysql_async::OptsBuilder>, BinlogError> {
    use mysql_async::{ClientIdentity, SslOpts};
    use std::path::PathBuf;
    if mode == TlsMode::Off {
        return Ok(None);
    }
    let path = |path: String| PathBuf::from(path).into();
    let mut ssl = SslOpts::default()
        .with_danger_accept_invalid_certs(matches!(mode, TlsMode::Preferred | TlsMode::Required))
        .with_danger_skip_domain_validation(mode != TlsMode::VerifyIdentity);
    if let Some(ca) = ca {
        ssl = ssl.with_root_certs(vec![path(ca)]);
    }
    if let Some((cert, key)) = identity {
        ssl = ssl.with_client_identity(Some(ClientIdentity::new(path(cert), path(key))));
    }
    // Over a Unix socket, which mysql_async prefers on a local server, no
    // TLS would be used.
    Ok(Some(plain.clone().ssl_opts(ssl).prefer_socket(false)))
}

#[cfg(not(feature = "binlog-feed-tls"))]
fn tls_options(
    _plain: &mysql_async::OptsBuilder,
    mode: TlsMode,
    _ca: Option<String>,
    _identity: Option<(String, String)>,
) -> Result<Option<mysql_async::OptsBuilder>, BinlogError> {
    match mode {
        TlsMode::Off | TlsMode::Preferred => Ok(None),
        _ => Err(BinlogError::Url(
            "the URL requires TLS, and the binary log stream has it with the feature binlog-feed-tls only".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{options, TlsMode};

    #[test]
    fn a_url_gives_its_parts_and_its_tls_mode() {
        let options = options("mysql://bloom:p%40ss@db.example:3307/shop").expect("a valid URL");
        assert_eq!(options.mode, TlsMode::Preferred);
        let opts: mysql_async::Opts = options.plain.clone().into();
        assert_eq!(opts.ip_or_hostname(), "db.example");
        assert_eq!(opts.tcp_port(), 3307);
        assert_eq!(opts.user(), Some("bloom"));
        assert_eq!(opts.pass(), Some("p@ss"));
        assert_eq!(opts.db_name(), Some("shop"));
        assert!(super::options("postgres://a@b/c").is_err());
        assert!(super::options("mysql://a@b/c?ssl-mode=SOMETIMES").is_err());
        let off = super::options("mysql://a@b/c?ssl-mode=DISABLED").expect("valid");
        assert_eq!(off.attempts().len(), 1);
    }

    #[cfg(not(feature = "binlog-feed-tls"))]
    #[test]
    fn without_tls_a_url_that_requires_it_is_refused() {
        assert!(options("mysql://a@b/c?ssl-mode=REQUIRED").is_err());
        assert_eq!(options("mysql://a@b/c").expect("valid").attempts().len(), 1);
    }

    #[cfg(feature = "binlog-feed-tls")]
    #[test]
    fn with_tls_preferred_tries_tls_first_and_required_only_tls() {
        let preferred = options("mysql://a@b/c").expect("valid");
        let attempts = preferred.attempts();
        assert_eq!(attempts.len(), 2);
        assert!(attempts[0].ssl_opts().is_some() && attempts[1].ssl_opts().is_none());
        let required = options("mysql://a@b/c?ssl-mode=VERIFY_IDENTITY").expect("valid");
        let attempts = required.attempts();
        assert_eq!(attempts.len(), 1);
        assert!(attempts[0].ssl_opts().is_some());
    }
}
