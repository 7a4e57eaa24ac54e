//! Every template of `cases.json`, rendered here and by Go's own
//! `text/template` (the program in `go-template/`, run with the Go toolchain) over
//! the same Knative-shaped request-log data: whether it parses, whether it
//! runs, and every byte it writes must be the same.

use std::borrow::Cow;
use std::path::Path;
use std::process::Command;

use qproxy_go_template::{Object, Template, Value};

struct Url;

impl Object for Url {
    fn type_name(&self) -> &'static str {
        "*url.URL"
    }
    fn field(&self, name: &str) -> Option<Value<'_>> {
        Some(match name {
            "Path" => Value::str("/path/a b"),
            "RawQuery" => Value::str("q=a&b=<c>"),
            "Scheme" | "Host" | "Fragment" | "RawPath" => Value::str(""),
            _ => return None,
        })
    }
    fn write_v(&self, out: &mut Vec<u8>, _pointer: bool) {
        out.extend_from_slice(b"/path/a%20b?q=a&b=<c>");
    }
}

struct Request {
    headers: Vec<(&'static str, Vec<&'static [u8]>)>,
    url: Url,
}

impl Request {
    fn header(&self, name: &str) -> &'static [u8] {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.first().copied())
            .unwrap_or(b"")
    }
}

impl Object for Request {
    fn type_name(&self) -> &'static str {
        "*http.Request"
    }
    fn field(&self, name: &str) -> Option<Value<'_>> {
        Some(match name {
            "Method" => Value::str("POST"),
            "RequestURI" => Value::str("/path/a%20b?q=a&b=<c>"),
            "URL" => Value::Object(&self.url),
            "Proto" => Value::str("HTTP/1.1"),
            "ProtoMajor" | "ProtoMinor" => Value::Int(1),
            "ContentLength" => Value::Int(42),
            "Host" => Value::str("example.com"),
            "RemoteAddr" => Value::str("10.0.0.1:5555"),
            "UserAgent" => Value::bytes(self.header("User-Agent")),
            "Referer" => Value::bytes(self.header("Referer")),
            "Header" => Value::Map {
                entries: self
                    .headers
                    .iter()
                    .map(|(k, vs)| {
                        let values = vs.iter().map(|v| Value::bytes(v)).collect();
                        (Cow::Borrowed(k.as_bytes()), Value::List(values))
                    })
                    .collect(),
                header: true,
            },
            _ => return None,
        })
    }
    fn write_v(&self, out: &mut Vec<u8>, _pointer: bool) {
        out.extend_from_slice(b"&{POST ...}");
    }
}

struct Response;

impl Object for Response {
    fn type_name(&self) -> &'static str {
        "*main.response"
    }
    fn field(&self, name: &str) -> Option<Value<'_>> {
        Some(match name {
            "Code" => Value::Int(200),
            "Size" => Value::Int(1234),
            "Latency" => Value::Float(0.001234567),
            _ => return None,
        })
    }
    fn write_v(&self, out: &mut Vec<u8>, pointer: bool) {
        if pointer {
            out.push(b'&');
        }
        out.extend_from_slice(b"{200 1234 0.001234567}");
    }
}

struct Revision;

const REVISION: [(&str, &str); 6] = [
    ("Name", "rev-1"),
    ("Namespace", "ns"),
    ("Service", "svc"),
    ("Configuration", "cfg"),
    ("PodName", "pod-1"),
    ("PodIP", "10.0.0.2"),
];

impl Object for Revision {
    fn type_name(&self) -> &'static str {
        "*main.revision"
    }
    fn field(&self, name: &str) -> Option<Value<'_>> {
        REVISION
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| Value::str(v))
    }
    fn write_v(&self, out: &mut Vec<u8>, pointer: bool) {
        if pointer {
            out.push(b'&');
        }
        let fields: Vec<_> = REVISION.iter().map(|(_, v)| *v).collect();
        out.extend_from_slice(format!("{{{}}}", fields.join(" ")).as_bytes());
    }
}

struct Input {
    request: Request,
    response: Response,
    revision: Revision,
}

impl Object for Input {
    fn type_name(&self) -> &'static str {
        "*main.input"
    }
    fn field(&self, name: &str) -> Option<Value<'_>> {
        Some(match name {
            "Request" => Value::Object(&self.request),
            "Response" => Value::Object(&self.response),
            "Revision" => Value::Object(&self.revision),
            "TraceID" => Value::str("0af7651916cd43dd8448eb211c80319c"),
            _ => return None,
        })
    }
    fn write_v(&self, out: &mut Vec<u8>, _pointer: bool) {
        out.extend_from_slice(b"&{...}");
    }
}

#[derive(Debug, PartialEq)]
struct Outcome {
    parsed: bool,
    ran: bool,
    out: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn shown(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex from Go"))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
#[ignore = "runs Go's text/template: scripts/test runs it"]
fn renders_what_go_renders() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-template");
    let cases_path = dir.join("cases.json");
    let cases: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&cases_path).expect("cases.json"))
            .expect("cases");
    let go = Command::new("go")
        .args(["run", "main.go"])
        .arg(&cases_path)
        .current_dir(&dir)
        .env("GO111MODULE", "off")
        .output()
        .expect("the Go toolchain (go) must be installed");
    assert!(
        go.status.success(),
        "{}",
        String::from_utf8_lossy(&go.stderr)
    );
    let expected: Vec<serde_json::Value> = serde_json::from_slice(&go.stdout).expect("Go's JSON");
    assert_eq!(expected.len(), cases.len());

    let data = Input {
        request: Request {
            headers: vec![
                ("User-Agent", vec![b"curl/8.0 \"x\" <y>"]),
                ("Referer", vec![b"http://ref/?a=b&c='d'"]),
                ("X-B3-Traceid", vec![b"abc123"]),
                ("Accept", vec![b"text/plain", b"*/*"]),
                (
                    "X-Bin",
                    vec![b"caf\xc3\xa9 \xff \xe2\x80\xa8 \xc2\xa0 \t\x01 ok"],
                ),
            ],
            url: Url,
        },
        response: Response,
        revision: Revision,
    };
    let mut failures = Vec::new();
    for (i, (case, want)) in cases.iter().zip(&expected).enumerate() {
        let want = Outcome {
            parsed: want["parsed"].as_bool().unwrap_or(false),
            ran: want["ran"].as_bool().unwrap_or(false),
            out: shown(want["out"].as_str().unwrap_or("")),
        };
        let got = match Template::parse(case) {
            Err(_) => Outcome {
                parsed: false,
                ran: false,
                out: String::new(),
            },
            Ok(t) => {
                let mut out = Vec::new();
                let ran = t.execute(&mut out, Value::Object(&data)).is_ok();
                Outcome {
                    parsed: true,
                    ran,
                    out: shown(&hex(&out)),
                }
            }
        };
        if got != want {
            failures.push(format!(
                "case {i}: {case}\n  go:   {want:?}\n  ours: {got:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
