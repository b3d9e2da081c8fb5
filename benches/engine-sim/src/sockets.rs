//! The engine's side of its KV-event sockets, as vLLM's publisher has
//! them (`docs/events.md`, "Formats accepted"): live batches on a PUB
//! socket, and replays answered on a ROUTER socket. The tests' fake
//! engines and the load tester's fleets send through these two functions,
//! so they speak the one wire the server reads.

/// Sends batch `seq` on a PUB (or XPUB) socket: `[topic, seq, payload]`,
/// the number as 8 big-endian bytes.
pub fn send_live(socket: &zmq::Socket, topic: &[u8], seq: u64, payload: &[u8]) -> zmq::Result<()> {
    let msg: [&[u8]; 3] = [topic, &seq.to_be_bytes(), payload];
    socket.send_multipart(msg, 0)
}

/// The first batch a replay request asks for: `request` is what a ROUTER
/// socket received, `[identity, "", start]` with the start as big-endian
/// bytes. None for a message of another shape.
pub fn replay_start(request: &[Vec<u8>]) -> Option<u64> {
    let [_, empty, start] = request else {
        return None;
    };
    let start = <[u8; 8]>::try_from(&start[..]).ok()?;
    empty.is_empty().then(|| u64::from_be_bytes(start))
}

/// Answers the replay `request` on `router` with `batches` (`(seq,
/// payload)`, in order: those from the start asked for), each as
/// `[identity, "", topic, seq, payload]`, then the end marker `[identity,
/// "", "", u64::MAX, ""]`. A request of another shape is not answered.
pub fn answer_replay<'a>(
    router: &zmq::Socket,
    request: &[Vec<u8>],
    topic: &[u8],
    batches: impl IntoIterator<Item = (u64, &'a [u8])>,
) -> zmq::Result<()> {
    let (Some(start), Some(id)) = (replay_start(request), request.first()) else {
        return Ok(());
    };
    for (seq, payload) in batches.into_iter().filter(|(seq, _)| *seq >= start) {
        let msg: [&[u8]; 5] = [id, b"", topic, &seq.to_be_bytes(), payload];
        router.send_multipart(msg, 0)?;
    }
    let end: [&[u8]; 5] = [id, b"", b"", &u64::MAX.to_be_bytes(), b""];
    router.send_multipart(end, 0)
}
