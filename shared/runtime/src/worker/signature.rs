//! The webhook signature: how the engine signs a decision request and how a worker checks it.
//!
//! The header is `X-Turnstone-Signature: t=<unix seconds>,v1=<hex>`, where `<hex>` is
//! HMAC-SHA256 keyed with the agent's worker secret over `"<t>.<body>"`, the body being the
//! exact bytes sent. A worker recomputes it over the raw body it received (before any JSON
//! parsing), compares in constant time, and refuses timestamps too far from its clock, which
//! bounds replays. Several `v1=` entries may appear (any one matching is enough) and entries
//! with other names are ignored, so secrets can be rotated and schemes added later.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The name of the signature header.
pub const SIGNATURE_HEADER: &str = "x-turnstone-signature";

/// How far a signature's timestamp may be from the verifier's clock by default (5 minutes).
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// Why a signature header does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The header is not `t=<unix>,v1=<hex>`.
    #[error("malformed signature header: {reason}")]
    Malformed {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No `v1` signature matches the body and the secret.
    #[error("signature does not match")]
    Mismatch,
    /// The signature is authentic but its timestamp is too far from now (a replay or a bad clock).
    #[error("signature timestamp is {skew_secs}s away from now, beyond the tolerance")]
    OutsideTolerance {
        /// Now minus the timestamp, in seconds (negative: in the future).
        skew_secs: i64,
    },
}

fn mac(secret: &[u8], t: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length (long keys are hashed, short ones padded), so
    // `new_from_slice` cannot fail for `Hmac<Sha256>`.
    #[allow(clippy::expect_used)]
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The signature header value (`t=<t>,v1=<hex>`) for `body` sent at unix time `t`.
pub fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    let digest = mac(secret, t, body).finalize().into_bytes();
    format!("t={t},v1={}", hex::encode(digest))
}

/// Checks a signature header against the raw `body`, in constant time, allowing the timestamp
/// to differ from `now_unix` by at most `tolerance_secs` either way.
pub fn verify(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        let Some((key, value)) = part.split_once('=') else {
            return Err(SignatureError::Malformed { reason: "expected key=value pairs" });
        };
        match key.trim() {
            "t" => {
                if timestamp.is_some() {
                    return Err(SignatureError::Malformed { reason: "more than one timestamp" });
                }
                let t = value
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| SignatureError::Malformed { reason: "timestamp is not an integer" })?;
                timestamp = Some(t);
            }
            "v1" => signatures.push(value.trim()),
            // Other schemes are for other verifiers.
            _ => {}
        }
    }
    let Some(t) = timestamp else {
        return Err(SignatureError::Malformed { reason: "no timestamp" });
    };
    let decoded: Vec<Vec<u8>> = signatures.iter().filter_map(|hex| hex::decode(hex).ok()).collect();
    if decoded.is_empty() {
        return Err(SignatureError::Malformed { reason: "no v1 signature in hex" });
    }
    let expected = mac(secret, t, body);
    if !decoded.iter().any(|candidate| expected.clone().verify_slice(candidate).is_ok()) {
        return Err(SignatureError::Mismatch);
    }
    let skew_secs = now_unix.saturating_sub(t);
    if skew_secs.unsigned_abs() > tolerance_secs.max(0).unsigned_abs() {
        return Err(SignatureError::OutsideTolerance { skew_secs });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // Computed with `printf '1700000000.{}' | openssl dgst -sha256 -hmac secret`.
        let header = sign(b"secret", 1_700_000_000, b"{}");
        assert_eq!(
            header,
            "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
        assert_eq!(verify(b"secret", &header, b"{}", 1_700_000_000, 300), Ok(()));
    }

    #[test]
    fn tampering_and_tolerance() {
        let header = sign(b"k", 1000, b"body");
        assert_eq!(verify(b"k", &header, b"body!", 1000, 300), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"other", &header, b"body", 1000, 300), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"k", &header, b"body", 1300, 300), Ok(()));
        assert_eq!(
            verify(b"k", &header, b"body", 1301, 300),
            Err(SignatureError::OutsideTolerance { skew_secs: 301 })
        );
        assert_eq!(
            verify(b"k", &header, b"body", 600, 300),
            Err(SignatureError::OutsideTolerance { skew_secs: -400 })
        );
        // The timestamp is signed: moving it breaks the signature.
        let moved = header.replace("t=1000", "t=1001");
        assert_eq!(verify(b"k", &moved, b"body", 1000, 300), Err(SignatureError::Mismatch));
    }

    #[test]
    fn rotation_and_unknown_schemes() {
        let good = sign(b"new", 5, b"x");
        let old = sign(b"old", 5, b"x");
        let old_hex = old.split_once(",v1=").unwrap().1;
        let good_hex = good.split_once(",v1=").unwrap().1;
        let header = format!("t=5, v1={old_hex}, v0=zz, v1={good_hex}");
        assert_eq!(verify(b"new", &header, b"x", 5, 0), Ok(()));
        assert_eq!(verify(b"old", &header, b"x", 5, 0), Ok(()));
    }

    #[test]
    fn malformed_headers() {
        for header in ["", "garbage", "t=abc,v1=00", "v1=00", "t=1", "t=1,v1=zz", "t=1,t=2,v1=00"] {
            assert!(
                matches!(verify(b"k", header, b"", 1, 300), Err(SignatureError::Malformed { .. })),
                "{header:?}"
            );
        }
    }
}
