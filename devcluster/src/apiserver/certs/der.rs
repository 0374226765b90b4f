//! A minimal DER reader and writer for the few X.509 and PKCS#10
//! structures the server reads (client certificates, certificate signing
//! requests) and writes (the certificates it signs).
//!
//! Invariant: the reader is bounded by its input and never panics; a value
//! it cannot read is `None`.

/// `SEQUENCE`.
pub(crate) const SEQUENCE: u8 = 0x30;
/// `OBJECT IDENTIFIER`.
pub(crate) const OID: u8 = 0x06;
/// `INTEGER`.
pub(crate) const INTEGER: u8 = 0x02;
/// `BIT STRING`.
pub(crate) const BIT_STRING: u8 = 0x03;
/// `OCTET STRING`.
pub(crate) const OCTET_STRING: u8 = 0x04;
/// `BOOLEAN`.
pub(crate) const BOOLEAN: u8 = 0x01;

/// One element of `input`: its tag, its content, the whole element (tag
/// and length included) and what follows it.
pub(crate) struct Element<'a> {
    pub(crate) tag: u8,
    pub(crate) content: &'a [u8],
    pub(crate) raw: &'a [u8],
}

/// The first element of `input` and the rest.
pub(crate) fn read(input: &[u8]) -> Option<(Element<'_>, &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some((
        Element {
            tag,
            content: &rest[..len],
            raw: &input[..header + len],
        },
        &rest[len..],
    ))
}

/// The elements of a constructed value's content.
pub(crate) fn children(mut input: &[u8]) -> Option<Vec<Element<'_>>> {
    let mut out = Vec::new();
    while !input.is_empty() {
        let (e, rest) = read(input)?;
        out.push(e);
        input = rest;
    }
    Some(out)
}

/// The single element `input` holds (nothing after it).
pub(crate) fn whole(input: &[u8]) -> Option<Element<'_>> {
    match read(input)? {
        (e, []) => Some(e),
        _ => None,
    }
}

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// The subject `Name` of a DER X.509 certificate.
pub(crate) fn certificate_subject(cert: &[u8]) -> Option<Element<'_>> {
    let outer = whole(cert).filter(|e| e.tag == SEQUENCE)?;
    let tbs = children(outer.content)?
        .into_iter()
        .next()
        .filter(|e| e.tag == SEQUENCE)?;
    let fields = children(tbs.content)?;
    // [0] version is optional; then serial, signature, issuer, validity,
    // subject.
    let skip = usize::from(fields.first()?.tag == 0xa0);
    fields
        .into_iter()
        .nth(skip + 4)
        .filter(|e| e.tag == SEQUENCE)
}

/// The common name (empty when there is none) and the organizations, in
/// order, of a `Name`: every CN and O of every RDN, multi-valued ones
/// included (as openssl writes `O = a + O = b`).
pub(crate) fn common_name_and_orgs(name: &Element<'_>) -> Option<(String, Vec<String>)> {
    let mut cn = String::new();
    let mut orgs = Vec::new();
    for rdn in children(name.content)? {
        for atv in children(rdn.content)? {
            let parts = children(atv.content)?;
            let [oid, value] = parts.as_slice() else {
                return None;
            };
            if oid.tag != OID {
                return None;
            }
            let value = String::from_utf8(value.content.to_vec()).ok()?;
            if oid.content == OID_CN {
                cn = value;
            } else if oid.content == OID_O {
                orgs.push(value);
            }
        }
    }
    Some((cn, orgs))
}

/// An element with `tag` around `content`.
pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .iter()
            .copied()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// A `SEQUENCE` of already encoded elements.
pub(crate) fn seq(items: &[&[u8]]) -> Vec<u8> {
    tlv(SEQUENCE, &items.concat())
}

/// The DER content of an object identifier given in dotted form.
pub(crate) fn oid(dotted: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |mut n: u64| {
        let mut bytes = vec![(n & 0x7f) as u8];
        n >>= 7;
        while n > 0 {
            bytes.push(0x80 | (n & 0x7f) as u8);
            n >>= 7;
        }
        bytes.reverse();
        out.extend(bytes);
    };
    if let [a, b, rest @ ..] = dotted {
        push(a * 40 + b);
        for n in rest {
            push(*n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_write_round_trip_and_junk_is_refused() {
        let long = vec![7u8; 300];
        let e = tlv(OCTET_STRING, &long);
        assert_eq!(&e[..4], &[0x04, 0x82, 0x01, 0x2c]);
        let got = whole(&e).expect("element");
        assert_eq!(
            (got.tag, got.content.len(), got.raw.len()),
            (OCTET_STRING, 300, 304)
        );
        assert_eq!(oid(&[2, 5, 4, 10]), [0x55, 0x04, 0x0a]);
        assert_eq!(
            oid(&[1, 2, 840, 113549]),
            [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d]
        );
        for junk in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x05\x00",
        ] {
            assert!(whole(junk).is_none());
        }
        for cut in 0..e.len() {
            let _ = read(&e[..cut]);
        }
    }
}
