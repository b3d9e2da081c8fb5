//! The engine ops' wire forms and the server's own: [`EngineSub`] ↔
//! [`Subscription`], and [`State`] → [`EngineState`].
//!
//! The protocol crate checks sizes ([`prefix_proto::Limits::check_op`]);
//! what the server asks beyond them (`tcp://` endpoints, upper-case media)
//! is checked here, as the text form's parser checks it.

use prefix_proto::{EngineState, EngineSub};

use super::{State, Subscription, SubscriptionError};

impl TryFrom<EngineSub> for Subscription {
    type Error = SubscriptionError;

    /// The subscription a `subscribe` op asks for, with its media in upper
    /// case; refused, like `--engine`, unless its endpoints are `tcp://`.
    fn try_from(w: EngineSub) -> Result<Self, Self::Error> {
        let sub = Subscription {
            pod: w.pod,
            model: w.model,
            endpoint: w.endpoint,
            replay: w.replay,
            block_size: w.block_size,
            topic: w.topic,
            media: w.media.iter().map(|m| m.to_ascii_uppercase()).collect(),
        };
        sub.check_endpoints()?;
        // One tier per name: a name with a separator in it ("GPU+CPU")
        // would match no event's medium, silently.
        if let Some(bad) = sub
            .media
            .iter()
            .find(|m| m.is_empty() || m.contains(['+', ',']))
        {
            return Err(SubscriptionError::Syntax {
                why: format!(
                    "medium {bad:?} is not one tier name: list them apart, as [\"GPU\", \"CPU\"]"
                ),
                text: sub.to_string(),
            });
        }
        Ok(sub)
    }
}

impl From<Subscription> for EngineSub {
    fn from(s: Subscription) -> Self {
        EngineSub {
            pod: s.pod,
            model: s.model,
            endpoint: s.endpoint,
            replay: s.replay,
            block_size: s.block_size,
            topic: s.topic,
            media: s.media,
        }
    }
}

/// A subscription and its state as a `ListEngines` reply carries them.
pub(crate) fn engine_state(sub: Subscription, s: State) -> EngineState {
    EngineState {
        sub: sub.into(),
        connected: s.connected,
        last_seq: s.last_seq,
        events: s.events,
        blocks_stored: s.blocks_stored,
        blocks_removed: s.blocks_removed,
        resyncs: s.resyncs,
        replays: s.replays,
        orphaned: s.orphaned,
        decode_errors: s.decode_errors,
        lag_ms: s.lag_ms,
        last_error: s.last_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(endpoint: &str, replay: Option<&str>) -> EngineSub {
        EngineSub {
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
        let sub = Subscription::try_from(wire("tcp://h:1", Some("tcp://h:2"))).unwrap();
        assert_eq!(sub.media, ["GPU", "CPU"]);
        let text = "pod=vllm-0,model=m,endpoint=tcp://h:1,replay=tcp://h:2,block-size=64,topic=kv,media=GPU+CPU";
        assert_eq!(sub, text.parse().unwrap());
        let back = EngineSub::from(sub.clone());
        assert_eq!(Subscription::try_from(back).unwrap(), sub);
        for (endpoint, replay) in [("ipc:///x", None), ("tcp://h:1", Some("h:2"))] {
            let err = Subscription::try_from(wire(endpoint, replay)).unwrap_err();
            assert!(err.to_string().contains("is not tcp://"), "{err}");
        }
        for media in [["GPU+CPU", "X"], ["GPU", ""], ["GPU,CPU", "X"]] {
            let mut w = wire("tcp://h:1", None);
            w.media = media.map(Into::into).to_vec();
            let err = Subscription::try_from(w).unwrap_err().to_string();
            assert!(err.contains("not one tier name"), "{media:?}: {err}");
        }
    }
}
