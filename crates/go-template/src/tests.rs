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

#[test]
fn range_over_an_integer_makes_one_element_at_a_time() {
    assert_eq!(
        render("{{range 3}}{{.}}{{end}}", Value::Nil).unwrap(),
        "012"
    );
    assert_eq!(
        render("{{range 0}}x{{else}}none{{end}}", Value::Nil).unwrap(),
        "none"
    );
    // Made all at once, these elements would need terabytes; the first
    // one fails the template.
    let e = render("{{range 100000000000}}{{index . 0}}{{end}}", Value::Nil).unwrap_err();
    assert!(e.to_string().contains("index"), "{e}");
}

#[test]
fn printf_refuses_widths_and_precisions_past_a_million_as_go_does() {
    let printf = |f: &str| {
        let mut out = Vec::new();
        crate::printf::sprintf(f.as_bytes(), &[Value::Int(7)], &mut out);
        String::from_utf8(out).expect("utf-8")
    };
    assert_eq!(printf("%3d|"), "  7|");
    assert_eq!(printf("a%90000000000000dz"), "a%!(NOVERB)%!(EXTRA int=7)");
    assert_eq!(printf("a%.90000000000000fz"), "a%!(NOVERB)%!(EXTRA int=7)");
    assert_eq!(printf("%1000001d").len(), 1_000_001);
    assert_eq!(printf("%5."), "%!.(int=    7)");
    assert_eq!(printf("%-4z|"), "%!z(int=7   )|");
}

#[test]
fn printf_takes_precisions_past_what_rust_formats_as_go_does() {
    let printf = |f: &str, v: f64| {
        let mut out = Vec::new();
        crate::printf::sprintf(f.as_bytes(), &[Value::Float(v)], &mut out);
        String::from_utf8(out).expect("utf-8")
    };
    let f = printf("%.288888f", 0.1);
    assert_eq!(f.len(), 2 + 288_888);
    assert!(
        f.starts_with("0.1000000000000000055511151231257827"),
        "{}",
        &f[..40]
    );
    assert!(f.ends_with("000"));
    let e = printf("%.70000e", 1.5);
    assert_eq!(e.len(), "1.".len() + 70_000 + "e+00".len());
    assert!(
        e.starts_with("1.5000") && e.ends_with("0e+00"),
        "{}",
        &e[e.len() - 10..]
    );
    // As Go prints them.
    assert_eq!(
        printf("%.70000g", 0.1),
        "0.1000000000000000055511151231257827021181583404541015625"
    );
}
