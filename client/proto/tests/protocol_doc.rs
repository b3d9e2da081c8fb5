//! The test vectors of `docs/protocol.md` are this codec's bytes: every frame
//! there splits whole, decodes, and encodes back to the same bytes; a request
//! the codec refuses is followed by exactly the error frame a server sends.

use prefix_proto::{
    decode_request, decode_response, encode_request, encode_response, split_frame, FrameReader,
    Kind, Response, MAX_FRAME_CEILING,
};

const DOC: &str = include_str!("../../../docs/protocol.md");

/// The frames of the "Test vectors" section: each fenced block holds frames
/// separated by blank lines, one line of up to 16 hex bytes each, followed by
/// a comment from column 50 on.
fn frames() -> Vec<Vec<u8>> {
    let section = DOC
        .split("## Test vectors")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Test vectors section");
    let mut frames = Vec::new();
    for block in section.split("```").skip(1).step_by(2) {
        for frame in block.split("\n\n") {
            let bytes: Vec<u8> = frame
                .lines()
                .flat_map(|l| {
                    let hex = &l[..l.len().min(49)];
                    hex.split_whitespace()
                        .map_while(|t| {
                            (t.len() == 2)
                                .then(|| u8::from_str_radix(t, 16).ok())
                                .flatten()
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            if !bytes.is_empty() {
                frames.push(bytes);
            }
        }
    }
    frames
}

#[test]
fn the_documented_vectors_are_the_codecs_bytes() {
    let frames = frames();
    assert!(frames.len() >= 10, "found {} frames", frames.len());
    let mut refused = None;
    for bytes in &frames {
        let f = split_frame(bytes, MAX_FRAME_CEILING)
            .unwrap_or_else(|e| panic!("{e}: {bytes:02x?}"))
            .unwrap_or_else(|| panic!("not a whole frame: {bytes:02x?}"));
        assert_eq!(f.used, bytes.len(), "one frame, nothing after it");
        let id = f.header.request_id;
        let mut again = Vec::new();
        match f.header.kind {
            Kind::Request => match decode_request(f.payload, &Default::default()) {
                Ok(request) => {
                    encode_request(id, &request, &mut again);
                    assert_eq!(&again, bytes);
                }
                Err(e) => {
                    // The next vector is the server's answer to it.
                    encode_response(id, &Response::One(e.to_reply()), &mut again);
                    refused = Some(again);
                    continue;
                }
            },
            Kind::Response => {
                let response = decode_response(f.payload).unwrap();
                if let Some(answer) = refused.take() {
                    assert_eq!(&answer, bytes, "the answer to the refused request");
                }
                encode_response(id, &response, &mut again);
                assert_eq!(&again, bytes);
            }
        }
    }
    assert!(refused.is_none(), "a refused request without its answer");
}

#[test]
fn the_documented_answer_to_a_cut_header_is_the_readers() {
    let mut reader = FrameReader::new(Kind::Request, 1 << 20);
    reader.push(&[0x50, 0x49, 0x01, 0x01, 0x02]);
    let mut answer = Vec::new();
    reader.finish().unwrap_err().encode(&mut answer);
    let header: Vec<String> = answer[..16].iter().map(|b| format!("{b:02x}")).collect();
    let text = DOC.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        text.contains(&header.join(" ")),
        "the doc does not show the header {}",
        header.join(" ")
    );
    assert!(text.contains(&format!("by a {}-byte frame", answer.len())));
}
