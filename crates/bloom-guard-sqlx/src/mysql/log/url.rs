//! The binary log stream's connection settings, from the database's URL
//! as sqlx reads it: host, port, user, password, database, and a Unix
//! socket. TLS is not offered on the stream yet: a URL that requires it
//! is an error rather than a stream in the clear.

use super::error::BinlogError;

/// The stream's connection options for `url` (`mysql://` or `mariadb://`).
pub(crate) fn options(url: &str) -> Result<mysql_async::Opts, BinlogError> {
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
    let mut options = mysql_async::OptsBuilder::default()
        .ip_or_hostname(parsed.host_str().unwrap_or("localhost").to_owned())
        .tcp_port(parsed.port().unwrap_or(3306))
        .user(Some(decode(parsed.username())?))
        .pass(parsed.password().map(decode).transpose()?)
        .db_name(Some(decode(parsed.path().trim_start_matches('/'))?).filter(|db| !db.is_empty()));
    for (name, value) in parsed.query_pairs() {
        match (name.as_ref(), value.as_ref()) {
            ("socket", socket) => options = options.socket(Some(socket.to_owned())),
            ("ssl-mode" | "sslmode", mode)
                if matches!(
                    mode.to_ascii_lowercase().as_str(),
                    "required" | "verify_ca" | "verify_identity" | "verify-ca" | "verify-full"
                ) =>
            {
                return Err(BinlogError::Url(format!(
                    "ssl-mode={mode}: the binary log stream does not offer TLS yet; stream over a private network or a Unix socket"
                )));
            }
            _ => {}
        }
    }
    Ok(options.into())
}

#[cfg(test)]
mod tests {
    use super::options;

    #[test]
    fn a_url_gives_its_parts_and_refuses_what_the_stream_cannot_keep() {
        let opts = options("mysql://bloom:p%40ss@db.example:3307/shop").expect("a valid URL");
        assert_eq!(opts.ip_or_hostname(), "db.example");
        assert_eq!(opts.tcp_port(), 3307);
        assert_eq!(opts.user(), Some("bloom"));
        assert_eq!(opts.pass(), Some("p@ss"));
        assert_eq!(opts.db_name(), Some("shop"));
        assert!(options("postgres://a@b/c").is_err());
        assert!(options("mysql://a@b/c?ssl-mode=REQUIRED").is_err());
        assert!(options("mysql://a@b/c?ssl-mode=PREFERRED").is_ok());
    }
}
