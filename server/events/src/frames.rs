//! The ZeroMQ framing around payloads: live messages from the engine's PUB
//! socket, replies from its ROUTER replay socket, the replay request, and
//! the llm-d topic convention.
//!
//! Functions here take a multipart message as a slice of frames,
//! `&[F] where F: AsRef<[u8]>` (`&[Vec<u8>]`, `&[&[u8]]`, `&[zmq::Message]`
//! all fit), and return views borrowing from it: nothing is copied.
//!
//! The layouts, as vLLM 0.33 and SGLang 0.5 send them
//! (`ZmqEventPublisher` in `vllm/distributed/kv_events.py` and
//! `sglang/srt/disaggregation/kv_events.py`):
//!
//! | socket | frames |
//! | --- | --- |
//! | PUB → SUB | `topic`, `seq` (8 bytes, big-endian), `payload` |
//! | DEALER → ROUTER (request) | `""`, `start` (8 bytes, big-endian) |
//! | ROUTER → DEALER (reply, current) | `""`, `topic`, `seq`, `payload`, one message per batch with `seq ≥ start` |
//! | ROUTER → DEALER (reply, older engines) | `""`, `seq`, `payload` |
//! | end of a reply | `""`, `""`, [`END_SEQ`], `""` (older: `""`, [`END_SEQ`], `""`) |
//!
//! `seq` counts batches from 0 per publisher instance (an engine restart
//! starts again at 0); one message is one payload, decoded by
//! [`decode_batch`](crate::decode_batch).

/// The sequence number that ends a replay reply: `-1` as 8 big-endian
/// bytes, all ones. No batch has it (sequences count up from 0).
pub const END_SEQ: u64 = u64::MAX;

/// One batch as framed on the wire: from the live stream, or replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live<'a> {
    /// The publisher's topic (vLLM's `KVEventsConfig.topic`, `""` by
    /// default; llm-d deployments use `kv@<pod>@<model>`, see
    /// [`parse_topic`]). Empty for replies in the older replay layout, which
    /// have no topic frame.
    pub topic: &'a [u8],
    /// The batch's sequence number: consecutive per publisher, so a gap
    /// means lost batches (PUB drops silently at its high-water mark), and a
    /// sequence not above the last one means the engine restarted.
    pub seq: u64,
    /// The msgpack payload, for [`decode_batch`](crate::decode_batch).
    pub payload: &'a [u8],
}

/// One message of a replay reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayItem<'a> {
    /// A buffered batch, byte for byte as it was published live.
    Batch(Live<'a>),
    /// The end marker: no more messages answer this request.
    End,
}

/// Why a multipart message is not a KV-event message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The message has the wrong number of frames.
    #[error("expected {expected} frames, got {got}")]
    FrameCount {
        /// The count and layout expected.
        expected: &'static str,
        got: usize,
    },
    /// The sequence frame is not 8 bytes.
    #[error("sequence frame of {len} bytes (8 expected)")]
    SeqLength { len: usize },
    /// A replay reply does not start with the empty delimiter frame that a
    /// DEALER receives from a ROUTER.
    #[error("replay reply starts with a frame of {len} bytes, not the empty delimiter")]
    Delimiter { len: usize },
    /// A replay message has [`END_SEQ`] but a topic or payload: neither a
    /// batch (no batch has that sequence) nor a well-formed end marker.
    #[error(
        "end marker with a {topic}-byte topic and a {payload}-byte payload (both must be empty)"
    )]
    EndMarker { topic: usize, payload: usize },
}

/// Parses a live message as a SUB socket receives it: exactly 3 frames,
/// `topic`, `seq` (8 bytes, big-endian), `payload`.
pub fn parse_live<F: AsRef<[u8]>>(frames: &[F]) -> Result<Live<'_>, FrameError> {
    match frames {
        [topic, seq, payload] => Ok(Live {
            topic: topic.as_ref(),
            seq: seq_of(seq.as_ref())?,
            payload: payload.as_ref(),
        }),
        _ => Err(FrameError::FrameCount {
            expected: "3 (topic, sequence, payload)",
            got: frames.len(),
        }),
    }
}

/// Parses one replay reply message as a DEALER socket receives it: the
/// empty delimiter, then `[topic, seq, payload]` (current engines) or
/// `[seq, payload]` (older vLLM and SGLang); [`ReplayItem::End`] for the end
/// marker (`seq` = [`END_SEQ`], empty payload, and an empty topic in the
/// 4-frame layout).
///
/// Read replies until `End`: the publisher answers one request with every
/// buffered batch from `start` on. (A REQ socket would keep only the first
/// message of the reply.) A `start` older than the buffer silently starts at
/// its oldest batch, so check the first `seq` for a hole.
pub fn parse_replay<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayItem<'_>, FrameError> {
    let (delimiter, topic, seq, payload) = match frames {
        [delimiter, topic, seq, payload] => (delimiter, topic.as_ref(), seq, payload),
        [delimiter, seq, payload] => (delimiter, &[][..], seq, payload),
        _ => {
            return Err(FrameError::FrameCount {
                expected: "3 or 4 (delimiter, [topic,] sequence, payload)",
                got: frames.len(),
            })
        }
    };
    let delimiter = delimiter.as_ref();
    if !delimiter.is_empty() {
        return Err(FrameError::Delimiter {
            len: delimiter.len(),
        });
    }
    let seq = seq_of(seq.as_ref())?;
    let payload = payload.as_ref();
    if seq != END_SEQ {
        return Ok(ReplayItem::Batch(Live {
            topic,
            seq,
            payload,
        }));
    }
    if topic.is_empty() && payload.is_empty() {
        Ok(ReplayItem::End)
    } else {
        Err(FrameError::EndMarker {
            topic: topic.len(),
            payload: payload.len(),
        })
    }
}

/// The frames a DEALER sends to ask for every buffered batch from `start`
/// on: the empty delimiter (which a REQ socket would add itself) and `start`
/// as 8 big-endian bytes.
pub fn replay_request(start: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start.to_be_bytes().to_vec()]
}

fn seq_of(frame: &[u8]) -> Result<u64, FrameError> {
    <[u8; 8]>::try_from(frame)
        .map(u64::from_be_bytes)
        .map_err(|_| FrameError::SeqLength { len: frame.len() })
}

/// Splits a topic of the llm-d convention, `kv@<pod>@<model>`, into
/// `(pod, model)`; `None` for any other topic.
///
/// llm-d's collector (`parseTopic` in `pkg/kvevents/engineadapter/common.go`
/// of `llm-d/llm-d-kv-cache`) splits the topic on every `@` and takes the
/// pod and model only when there are exactly three parts; so does this
/// function, which also requires the `kv` prefix (llm-d subscribes to `kv@`)
/// and a non-empty pod and model. So a model name may contain `/`
/// (`Qwen/Qwen3-32B`) but not `@`, and a pod may contain `:` (llm-d's docs
/// use `<pod-ip>:<port>`). The topic must be UTF-8.
pub fn parse_topic(topic: &[u8]) -> Option<(&str, &str)> {
    let topic = std::str::from_utf8(topic).ok()?;
    let mut parts = topic.split('@');
    let (prefix, pod, model) = (parts.next()?, parts.next()?, parts.next()?);
    let well_formed =
        prefix == "kv" && !pod.is_empty() && !model.is_empty() && parts.next().is_none();
    well_formed.then_some((pod, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYLOAD: &[u8] =
        b"\x93\xcb\x41\xda\xc3\x62\xe5\x85\xd5\xce\x91\x81\xa4type\xb0AllBlocksCleared\x00";

    #[test]
    fn live_messages_are_three_frames() {
        let seq = 20u64.to_be_bytes();
        let frames: [&[u8]; 3] = [b"kv-events", &seq, PAYLOAD];
        assert_eq!(
            parse_live(&frames),
            Ok(Live {
                topic: b"kv-events",
                seq: 20,
                payload: PAYLOAD
            })
        );
        // Owned frames work too, and an empty topic (vLLM's default).
        let owned = vec![Vec::new(), vec![0xff; 8], PAYLOAD.to_vec()];
        let live = parse_live(&owned).unwrap();
        assert_eq!((live.topic, live.seq), (&b""[..], u64::MAX));
    }

    #[test]
    fn live_messages_with_other_counts_or_seq_lengths_are_refused() {
        let seq = 0u64.to_be_bytes();
        let two: [&[u8]; 2] = [&seq, PAYLOAD];
        assert_eq!(
            parse_live(&two).unwrap_err().to_string(),
            "expected 3 (topic, sequence, payload) frames, got 2"
        );
        let four: [&[u8]; 4] = [b"", b"t", &seq, PAYLOAD];
        assert!(matches!(
            parse_live(&four),
            Err(FrameError::FrameCount { got: 4, .. })
        ));
        let short: [&[u8]; 3] = [b"t", &[0, 0, 0, 0, 1], PAYLOAD];
        assert_eq!(
            parse_live(&short).unwrap_err().to_string(),
            "sequence frame of 5 bytes (8 expected)"
        );
        let none: [&[u8]; 0] = [];
        assert!(parse_live(&none).is_err());
    }

    #[test]
    fn replay_replies_in_both_layouts() {
        let seq = 3u64.to_be_bytes();
        let current: [&[u8]; 4] = [b"", b"kv-events", &seq, PAYLOAD];
        assert_eq!(
            parse_replay(&current),
            Ok(ReplayItem::Batch(Live {
                topic: b"kv-events",
                seq: 3,
                payload: PAYLOAD
            }))
        );
        let older: [&[u8]; 3] = [b"", &seq, PAYLOAD];
        assert_eq!(
            parse_replay(&older),
            Ok(ReplayItem::Batch(Live {
                topic: b"",
                seq: 3,
                payload: PAYLOAD
            }))
        );
    }

    #[test]
    fn the_end_marker_in_both_layouts() {
        let end = END_SEQ.to_be_bytes();
        assert_eq!(end, [0xff; 8]);
        let current: [&[u8]; 4] = [b"", b"", &end, b""];
        assert_eq!(parse_replay(&current), Ok(ReplayItem::End));
        let older: [&[u8]; 3] = [b"", &end, b""];
        assert_eq!(parse_replay(&older), Ok(ReplayItem::End));
        let with_payload: [&[u8]; 4] = [b"", b"", &end, b"x"];
        assert_eq!(
            parse_replay(&with_payload).unwrap_err().to_string(),
            "end marker with a 0-byte topic and a 1-byte payload (both must be empty)"
        );
        let with_topic: [&[u8]; 4] = [b"", b"kv", &end, b""];
        assert_eq!(
            parse_replay(&with_topic),
            Err(FrameError::EndMarker {
                topic: 2,
                payload: 0
            })
        );
    }

    #[test]
    fn bad_replay_replies_are_refused() {
        let seq = 3u64.to_be_bytes();
        let no_delimiter: [&[u8]; 3] = [b"kv-events", &seq, PAYLOAD];
        assert_eq!(
            parse_replay(&no_delimiter).unwrap_err().to_string(),
            "replay reply starts with a frame of 9 bytes, not the empty delimiter"
        );
        let two: [&[u8]; 2] = [b"", &seq];
        assert_eq!(
            parse_replay(&two).unwrap_err().to_string(),
            "expected 3 or 4 (delimiter, [topic,] sequence, payload) frames, got 2"
        );
        let five: [&[u8]; 5] = [b"", b"", b"t", &seq, PAYLOAD];
        assert!(matches!(
            parse_replay(&five),
            Err(FrameError::FrameCount { got: 5, .. })
        ));
        let short_seq: [&[u8]; 4] = [b"", b"t", &[1, 2, 3, 4], PAYLOAD];
        assert_eq!(
            parse_replay(&short_seq),
            Err(FrameError::SeqLength { len: 4 })
        );
    }

    #[test]
    fn replay_requests_are_the_delimiter_and_the_start() {
        let [delimiter, start] = replay_request(0x0102_0304_0506_0708);
        assert!(delimiter.is_empty());
        assert_eq!(start, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn topics_of_the_llm_d_convention() {
        assert_eq!(
            parse_topic(b"kv@pod-123@llama-2-7b"),
            Some(("pod-123", "llama-2-7b"))
        );
        assert_eq!(
            parse_topic(b"kv@10.0.0.7:5557@Qwen/Qwen3-32B"),
            Some(("10.0.0.7:5557", "Qwen/Qwen3-32B"))
        );
        for other in [
            &b""[..],
            b"kv-events",
            b"kv@",
            b"kv@pod",
            b"kv@pod@",
            b"kv@@model",
            b"pod@model",
            b"xv@pod@model",
            b"kv@pod@org/model@rev",
            b"kv@pod@\xff",
        ] {
            assert_eq!(
                parse_topic(other),
                None,
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
    }
}
