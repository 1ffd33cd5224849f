//! How big one page of a read is: at most a count the caller asks for (within the route's
//! maximum) and at most [`MAX_PAGE_BYTES`] of JSON, so that behind a Lambda function, whose
//! response is at most 6 MB (Lambda quotas: "Invocation payload (request and response) 6 MB
//! each for synchronous"), every page of a long conversation or log still gets through.

use serde::Serialize;

/// The most JSON one page's items carry: 4 MiB, under Lambda's 6 MB with room for the
/// envelope and for API Gateway's escaping.
pub(crate) const MAX_PAGE_BYTES: usize = 4 << 20;

/// How many of `items`, from the first, make one page of at most `limit`: whole items while
/// their JSON stays within [`MAX_PAGE_BYTES`], and always the first (an item is never split,
/// and one too big for any page must still be readable).
pub(crate) fn fitting<'a, T: Serialize + 'a>(items: impl IntoIterator<Item = &'a T>, limit: usize) -> usize {
    let mut bytes = 0;
    let mut taken = 0;
    for item in items.into_iter().take(limit) {
        bytes += turnstone_engine::json_len(item);
        if taken > 0 && bytes > MAX_PAGE_BYTES {
            break;
        }
        taken += 1;
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_stops_at_its_limit_or_its_bytes_and_never_comes_back_empty() {
        let small = vec!["x"; 10];
        assert_eq!(fitting(&small, 3), 3);
        assert_eq!(fitting(&small, 50), 10);
        let big = vec!["y".repeat(MAX_PAGE_BYTES / 3); 10];
        assert_eq!(fitting(&big, 10), 2, "two thirds fit, the third crosses the line");
        let huge = vec!["z".repeat(MAX_PAGE_BYTES * 2)];
        assert_eq!(fitting(&huge, 10), 1, "a huge item still comes, alone");
        assert_eq!(fitting::<&str>(&[], 10), 0);
        assert_eq!(fitting(big.iter().rev(), 10), 2, "from the end as well");
        assert_eq!(turnstone_engine::json_len(&"ab\"c"), serde_json::to_vec("ab\"c").unwrap().len());
    }
}
