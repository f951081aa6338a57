//! Digests of a step: the SHA-256 of every tensor each launch writes, written as text
//! (`mono dump`), and two such dumps compared (`mono compare`): the first launch, in step order,
//! with a tensor that differs, and that tensor, named.
//!
//! The text: `# key: value` header lines (what ran: preset, seed, device, commit...), then per
//! launch a line `launch <TAB> index <TAB> name` followed by its tensors,
//! `tensor <TAB> name <TAB> bytes <TAB> sha256-hex`.

use std::fmt::Write;

use sha2::{Digest, Sha256};

use super::graph::Output;
use super::{Result, StepError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDigest {
    pub name: String,
    pub bytes: usize,
    pub sha256: [u8; 32],
}

impl TensorDigest {
    pub fn of(name: &str, data: &[u8]) -> Self {
        TensorDigest {
            name: name.to_owned(),
            bytes: data.len(),
            sha256: Sha256::digest(data).into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchDigest {
    pub index: usize,
    pub name: String,
    pub tensors: Vec<TensorDigest>,
}

impl LaunchDigest {
    /// Reads `outputs` back and digests each.
    pub fn of(index: usize, name: &str, outputs: &[Output]) -> Result<Self> {
        let tensors = outputs
            .iter()
            .map(|o| Ok(TensorDigest::of(&o.name, &o.data.bytes()?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(LaunchDigest {
            index,
            name: name.to_owned(),
            tensors,
        })
    }
}

/// A step's digests, launch by launch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    pub header: Vec<(String, String)>,
    pub launches: Vec<LaunchDigest>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.contains(['\t', '\n', '\r']) {
        return Err(StepError::Invalid(format!(
            "{what} name {name:?} cannot be written in a dump (empty, or a tab or line break)"
        )));
    }
    Ok(())
}

impl Dump {
    pub fn with_header(mut self, key: &str, value: &str) -> Self {
        self.header.push((key.to_owned(), value.replace('\n', " ")));
        self
    }

    pub fn to_text(&self) -> Result<String> {
        let mut out = String::new();
        for (k, v) in &self.header {
            let _ = writeln!(out, "# {k}: {v}");
        }
        for l in &self.launches {
            check_name("launch", &l.name)?;
            let _ = writeln!(out, "launch\t{}\t{}", l.index, l.name);
            for t in &l.tensors {
                check_name("tensor", &t.name)?;
                let _ = writeln!(out, "tensor\t{}\t{}\t{}", t.name, t.bytes, hex(&t.sha256));
            }
        }
        Ok(out)
    }

    /// Reads [`to_text`](Self::to_text)'s output; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let mut dump = Dump::default();
        for (n, line) in text.lines().enumerate() {
            let bad = |why: &str| StepError::Invalid(format!("{origin} line {}: {why}", n + 1));
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let (k, v) = rest
                    .split_once(": ")
                    .ok_or_else(|| bad("a header without ': '"))?;
                dump.header.push((k.to_owned(), v.to_owned()));
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            match fields[..] {
                ["launch", index, name] => dump.launches.push(LaunchDigest {
                    index: index
                        .parse()
                        .map_err(|_| bad("a launch index that is no number"))?,
                    name: name.to_owned(),
                    tensors: Vec::new(),
                }),
                ["tensor", name, bytes, sha] => {
                    let launch = dump
                        .launches
                        .last_mut()
                        .ok_or_else(|| bad("a tensor before any launch"))?;
                    launch.tensors.push(TensorDigest {
                        name: name.to_owned(),
                        bytes: bytes.parse().map_err(|_| bad("a size that is no number"))?,
                        sha256: unhex(sha)
                            .ok_or_else(|| bad("a digest that is not 64 hex digits"))?,
                    });
                }
                _ => return Err(bad("neither a launch nor a tensor line")),
            }
        }
        Ok(dump)
    }
}

/// How two dumps compare: equal, or the first difference in step order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Comparison {
    Equal {
        launches: usize,
        tensors: usize,
    },
    Differ {
        /// The launch (index and name) where the dumps first differ.
        launch: (usize, String),
        /// The tensor that differs, when the launch is in both with that tensor.
        tensor: Option<String>,
        what: String,
    },
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Comparison::Equal { launches, tensors } => write!(
                f,
                "equal: {launches} launches, {tensors} tensors, every digest the same"
            ),
            Comparison::Differ {
                launch,
                tensor,
                what,
            } => {
                write!(f, "first difference: launch {} ({})", launch.0, launch.1)?;
                if let Some(t) = tensor {
                    write!(f, ", tensor {t}")?;
                }
                write!(f, ": {what}")
            }
        }
    }
}

/// Compares `a` with `b` launch by launch, tensor by tensor.
pub fn compare(a: &Dump, b: &Dump) -> Comparison {
    let mut tensors = 0;
    for (i, la) in a.launches.iter().enumerate() {
        let Some(lb) = b.launches.get(i) else {
            return Comparison::Differ {
                launch: (la.index, la.name.clone()),
                tensor: None,
                what: "the second dump ends before this launch".into(),
            };
        };
        if la.name != lb.name || la.index != lb.index {
            return Comparison::Differ {
                launch: (la.index, la.name.clone()),
                tensor: None,
                what: format!("the second dump has launch {} ({}) here", lb.index, lb.name),
            };
        }
        for (j, ta) in la.tensors.iter().enumerate() {
            let differ = |what: String| Comparison::Differ {
                launch: (la.index, la.name.clone()),
                tensor: Some(ta.name.clone()),
                what,
            };
            let Some(tb) = lb.tensors.get(j) else {
                return differ("missing from the second dump".into());
            };
            if tb.name != ta.name {
                return differ(format!("the second dump has tensor {} here", tb.name));
            }
            if tb.bytes != ta.bytes {
                return differ(format!("{} bytes against {}", ta.bytes, tb.bytes));
            }
            if tb.sha256 != ta.sha256 {
                return differ(format!(
                    "SHA-256 {} against {}",
                    &hex(&ta.sha256)[..16],
                    &hex(&tb.sha256)[..16]
                ));
            }
            tensors += 1;
        }
        if let Some(extra) = lb.tensors.get(la.tensors.len()) {
            return Comparison::Differ {
                launch: (la.index, la.name.clone()),
                tensor: Some(extra.name.clone()),
                what: "only in the second dump".into(),
            };
        }
    }
    if let Some(extra) = b.launches.get(a.launches.len()) {
        return Comparison::Differ {
            launch: (extra.index, extra.name.clone()),
            tensor: None,
            what: "only in the second dump".into(),
        };
    }
    Comparison::Equal {
        launches: a.launches.len(),
        tensors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump of three launches over made-up outputs, with byte `flip` of launch `at`'s second
    /// tensor flipped when given.
    fn dump(flip: Option<(usize, usize)>) -> Dump {
        let mut d = Dump::default().with_header("preset", "tiny");
        for i in 0..3 {
            let mut a: Vec<u8> = (0..256u32).map(|x| (x * 7 + i as u32) as u8).collect();
            let mut b: Vec<u8> = (0..100u32).map(|x| (x ^ i as u32) as u8).collect();
            if let Some((at, byte)) = flip {
                if at == i {
                    b[byte] ^= 1;
                }
            }
            a.rotate_left(i);
            d.launches.push(LaunchDigest {
                index: i,
                name: format!("layer {i}"),
                tensors: vec![
                    TensorDigest::of("hidden", &a),
                    TensorDigest::of("lists", &b),
                ],
            });
        }
        d
    }

    #[test]
    fn equal_dumps_compare_equal_through_text() {
        let a = dump(None);
        let text = a.to_text().unwrap();
        let back = Dump::parse(&text, "a.dump").unwrap();
        assert_eq!(back, a);
        assert_eq!(
            compare(&a, &back),
            Comparison::Equal {
                launches: 3,
                tensors: 6
            }
        );
    }

    #[test]
    fn one_flipped_byte_names_its_launch_and_tensor() {
        let a = dump(None);
        let b = Dump::parse(&dump(Some((1, 42))).to_text().unwrap(), "b.dump").unwrap();
        match compare(&a, &b) {
            Comparison::Differ { launch, tensor, .. } => {
                assert_eq!(launch, (1, "layer 1".to_owned()));
                assert_eq!(tensor.as_deref(), Some("lists"));
            }
            other => panic!("the flipped byte was missed: {other}"),
        }
        // The earliest difference wins when several launches differ.
        let mut c = dump(Some((2, 0)));
        c.launches[0].tensors[0].sha256[5] ^= 0x80;
        let text = compare(&a, &c).to_string();
        assert!(text.contains("launch 0 (layer 0), tensor hidden"), "{text}");
    }

    #[test]
    fn missing_launches_and_bad_text_are_reported() {
        let a = dump(None);
        let mut short = a.clone();
        short.launches.pop();
        assert!(compare(&a, &short).to_string().contains("ends before"));
        assert!(compare(&short, &a)
            .to_string()
            .contains("only in the second"));
        let err = Dump::parse("launch\t0\tx\ntensor\ty\t1\tzz\n", "bad.dump").unwrap_err();
        assert!(err.to_string().contains("bad.dump line 2"), "{err}");
        let mut tabbed = a;
        tabbed.launches[0].name = "a\tb".into();
        assert!(tabbed.to_text().is_err());
    }
}
