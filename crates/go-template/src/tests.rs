use super::*;

fn render(src: &str, data: Value<'_>) -> Result<String, ExecError> {
    let t = Template::parse(src).expect("parses");
    let mut out = Vec::new();
    t.execute(&mut out, data)?;
    Ok(String::from_utf8(out).expect("utf-8"))
}

#[test]
fn parse_errors_name_the_line() {
    let e = Template::parse("ok\n{{if .}}\n{{nofunc}}{{end}}").unwrap_err();
    assert_eq!(e.to_string(), "line 3: function \"nofunc\" not defined");
    assert!(Template::parse("{{define \"x\"}}{{end}}").is_err());
}

#[test]
fn an_error_keeps_what_was_rendered_before_it() {
    let t = Template::parse("a{{.}}b{{index . 3}}c").unwrap();
    let mut out = Vec::new();
    let e = t
        .execute(&mut out, Value::List(vec![Value::str("x")]))
        .unwrap_err();
    assert_eq!(out, b"a[x]b");
    assert_eq!(e.to_string(), "error calling index: index out of range: 3");
}

#[test]
fn variables_are_scoped_to_their_block() {
    assert!(Template::parse("{{if true}}{{$x := 1}}{{end}}{{$x}}").is_err());
    let out = render("{{$x := 1}}{{if true}}{{$x = 2}}{{end}}{{$x}}", Value::Nil).unwrap();
    assert_eq!(out, "2");
}

#[test]
fn header_keys_are_canonical() {
    assert_eq!(&*canonical_header_key(b"x-b3-traceid"), b"X-B3-Traceid");
    assert_eq!(&*canonical_header_key(b"CONTENT-type"), b"Content-Type");
    assert_eq!(&*canonical_header_key(b"bad key"), b"bad key");
}
