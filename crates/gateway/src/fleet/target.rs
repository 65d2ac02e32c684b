//! What a configured backend URL names: one backend (`http://`), or every
//! engine behind a DNS name (`dns+http://NAME:PORT` for its A/AAAA records,
//! `dnssrv+http://NAME` for its SRV records), found by [`crate::fleet::discovery`].

/// Where a configured backend URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One backend at this URL.
    Fixed,
    /// Every address of `host`, at `port`.
    Hosts {
        /// `http` or `https`, for each engine found.
        scheme: &'static str,
        /// The DNS name.
        host: String,
        /// The engines' port.
        port: u16,
    },
    /// Every SRV record of `name`.
    Srv {
        /// `http` or `https`, for each engine found.
        scheme: &'static str,
        /// The SRV name, such as `_http._tcp.engines.ns.svc`.
        name: String,
    },
}

impl Target {
    /// Reads a backend URL; the error says what is wrong with it.
    pub fn parse(url: &str) -> Result<Self, String> {
        let schemes = [
            ("http://", None),
            ("https://", None),
            ("dns+http://", Some(("http", false))),
            ("dns+https://", Some(("https", false))),
            ("dnssrv+http://", Some(("http", true))),
            ("dnssrv+https://", Some(("https", true))),
        ];
        let Some((rest, kind)) =
            schemes.iter().find_map(|(prefix, kind)| Some((url.strip_prefix(prefix)?, *kind)))
        else {
            return Err(format!(
                "`{url}` is not an http:// URL (nor dns+http:// or dnssrv+http:// to discover backends)"
            ));
        };
        let Some((scheme, srv)) = kind else { return Ok(Self::Fixed) };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') {
            return Err(format!("`{url}`: a DNS name, without a path, is expected"));
        }
        if srv {
            if rest.contains(':') {
                return Err(format!("`{url}`: SRV records carry the ports; give the name alone"));
            }
            return Ok(Self::Srv { scheme, name: rest.to_owned() });
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => {
                let port = port.parse().map_err(|_| format!("`{url}`: `{port}` is not a port"))?;
                (host, port)
            }
            None => (rest, if scheme == "https" { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(format!("`{url}`: the name is missing"));
        }
        Ok(Self::Hosts { scheme, host: host.to_owned(), port })
    }
}

/// Whether `url` names backends by DNS (rather than being one).
pub fn is_discovered(url: &str) -> bool {
    url.starts_with("dns+") || url.starts_with("dnssrv+")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_urls_name_a_backend_or_a_dns_name() {
        assert_eq!(Target::parse("http://127.0.0.1:8081"), Ok(Target::Fixed));
        assert_eq!(
            Target::parse("dns+http://engines.slotgate.svc:8081/"),
            Ok(Target::Hosts { scheme: "http", host: "engines.slotgate.svc".into(), port: 8081 })
        );
        assert_eq!(
            Target::parse("dns+https://engines"),
            Ok(Target::Hosts { scheme: "https", host: "engines".into(), port: 443 })
        );
        assert_eq!(
            Target::parse("dnssrv+http://_http._tcp.engines"),
            Ok(Target::Srv { scheme: "http", name: "_http._tcp.engines".into() })
        );
        for bad in
            ["ftp://x", "dns+http://:80", "dns+http://e:x", "dns+http://e/v1", "dnssrv+http://e:80"]
        {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
