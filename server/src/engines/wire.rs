//! What the server asks of a `subscribe` op's [`Subscription`] beyond the
//! protocol's limits.
//!
//! The protocol crate checks sizes ([`prefix_proto::Limits::check_op`]) and
//! parses the text form; a subscription that arrives as an op is held to
//! what the text form's parser holds `--engine` to (`tcp://` endpoints,
//! upper-case media), and its media must each be one tier name.

use super::{Subscription, SubscriptionError};

/// The subscription a `subscribe` op asks for, with its media in upper
/// case; refused, like `--engine`, unless its endpoints are `tcp://`.
pub(crate) fn accept(mut sub: Subscription) -> Result<Subscription, SubscriptionError> {
    for m in &mut sub.media {
        m.make_ascii_uppercase();
    }
    sub.check_endpoints()?;
    // One tier per name: a name with a separator in it ("GPU+CPU") would
    // match no event's medium, silently.
    if let Some(bad) = sub
        .media
        .iter()
        .find(|m| m.is_empty() || m.contains(['+', ',']))
    {
        return Err(SubscriptionError {
            why: format!(
                "medium {bad:?} is not one tier name: list them apart, as [\"GPU\", \"CPU\"]"
            ),
            text: sub.to_string(),
        });
    }
    let lower = sub.lower_media().count();
    if lower > prefix_index::MAX_LOWER_TIERS as usize {
        return Err(SubscriptionError {
            why: format!(
                "{lower} lower cache tiers: a pod may have at most {}",
                prefix_index::MAX_LOWER_TIERS
            ),
            text: sub.to_string(),
        });
    }
    Ok(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(endpoint: &str, replay: Option<&str>) -> Subscription {
        Subscription {
            pod: "vllm-0".into(),
            model: "m".into(),
            endpoint: endpoint.into(),
            replay: replay.map(Into::into),
            block_size: 64,
            topic: "kv".into(),
            media: vec!["gpu".into(), "CPU".into()],
        }
    }

    #[test]
    fn wire_subscriptions_are_checked_like_the_text_form() {
        let sub = accept(wire("tcp://h:1", Some("tcp://h:2"))).unwrap();
        assert_eq!(sub.media, ["GPU", "CPU"]);
        let text = "pod=vllm-0,model=m,endpoint=tcp://h:1,replay=tcp://h:2,block-size=64,topic=kv,media=GPU+CPU";
        assert_eq!(sub, text.parse().unwrap());
        assert_eq!(accept(sub.clone()).unwrap(), sub);
        for (endpoint, replay) in [("ipc:///x", None), ("tcp://h:1", Some("h:2"))] {
            let err = accept(wire(endpoint, replay)).unwrap_err();
            assert!(err.to_string().contains("is not tcp://"), "{err}");
        }
        for media in [["GPU+CPU", "X"], ["GPU", ""], ["GPU,CPU", "X"]] {
            let mut w = wire("tcp://h:1", None);
            w.media = media.map(Into::into).to_vec();
            let err = accept(w).unwrap_err().to_string();
            assert!(err.contains("not one tier name"), "{media:?}: {err}");
        }
    }
}
