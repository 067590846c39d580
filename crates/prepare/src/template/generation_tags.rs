//! The `{% generation %}` tags of a chat template found as minijinja's lexer finds them, and
//! rewritten to a call block of the Rust function that marks what they render
//! ([`super::GENERATION_FN`]).

use super::GENERATION_FN;

/// Rewrites `{% generation %}` / `{% endgeneration %}` statement tags (with any `-`/`+`
/// whitespace control) to `{% call __dflash_generation() %}` / `{% endcall %}`; says whether
/// there were any. The source is scanned as minijinja's lexer scans it (comments, `{% raw %}`
/// blocks, and string literals inside tags), so the tags' text where it is not a statement
/// is left alone: a rewrite there would change what renders, and a `{% generation %}` in a
/// comment would otherwise mark a template without generation blocks as having them.
pub fn rewrite_generation(source: &str) -> (String, bool) {
    let b = source.as_bytes();
    let mut out = String::with_capacity(source.len() + 64);
    let mut found = false;
    // `source[..copied]` is in `out`; every position below is at an ASCII byte, so slicing
    // there stays on character boundaries.
    let mut copied = 0;
    let mut pos = 0;
    while let Some((start, kind)) = next_marker(b, pos) {
        let open_ctl = ctl_at(b, start + 2);
        let inner = start + 2 + open_ctl.len();
        pos = match kind {
            b'#' => find(b, inner, b"#}").map_or(b.len(), |e| e + 2),
            b'{' => end_of_tag(b, inner, b"}}"),
            _ => {
                if let Some((n, _)) = basic_tag(&b[inner..], b"raw", false) {
                    end_of_raw(b, inner + n)
                } else if let Some((replacement, n)) = [
                    (&b"generation"[..], format!("call {GENERATION_FN}()")),
                    (&b"endgeneration"[..], "endcall".to_string()),
                ]
                .into_iter()
                .find_map(|(name, stmt)| {
                    let (n, close_ctl) = basic_tag(&b[inner..], name, false)?;
                    Some((format!("{{%{open_ctl} {stmt} {close_ctl}%}}"), n))
                }) {
                    found = true;
                    out.push_str(&source[copied..start]);
                    out.push_str(&replacement);
                    copied = inner + n;
                    copied
                } else {
                    end_of_tag(b, inner, b"%}")
                }
            }
        };
    }
    out.push_str(&source[copied..]);
    (out, found)
}

/// The next `{{`, `{%` or `{#` at or after `from`: its position and its second byte.
fn next_marker(b: &[u8], from: usize) -> Option<(usize, u8)> {
    (from..b.len().saturating_sub(1)).find_map(|i| match (b[i], b[i + 1]) {
        (b'{', k @ (b'{' | b'%' | b'#')) => Some((i, k)),
        _ => None,
    })
}

/// The whitespace-control character at `i` (`-` or `+`), or "".
fn ctl_at(b: &[u8], i: usize) -> &'static str {
    match b.get(i) {
        Some(b'-') => "-",
        Some(b'+') => "+",
        _ => "",
    }
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| from + i)
}

/// minijinja's `skip_basic_tag`: whether `b` (what follows `{%` and its whitespace control,
/// unless `skip_ctl`) is the tag `name` with nothing else in it; the length through `%}` and
/// the closing whitespace control.
fn basic_tag(b: &[u8], name: &[u8], skip_ctl: bool) -> Option<(usize, &'static str)> {
    let mut i = 0;
    if skip_ctl && matches!(b.first(), Some(b'-' | b'+')) {
        i = 1;
    }
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    if !b[i..].starts_with(name) {
        return None;
    }
    i += name.len();
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let close_ctl = ctl_at(b, i);
    i += close_ctl.len();
    b[i..].starts_with(b"%}").then_some((i + 2, close_ctl))
}

/// Where a `{{ … }}` or `{% … %}` whose body starts at `from` ends (past `end`): as
/// minijinja lexes it, the end counts only outside string literals and brackets. An
/// unterminated tag runs to the end of the source (minijinja reports the error).
fn end_of_tag(b: &[u8], from: usize, end: &[u8]) -> usize {
    let mut i = from;
    let mut depth = 0isize;
    while i < b.len() {
        let rest = &b[i..];
        if depth == 0 {
            if matches!(rest[0], b'-' | b'+') && rest[1..].starts_with(end) {
                return i + 1 + end.len();
            }
            if rest.starts_with(end) {
                return i + end.len();
            }
        }
        match rest[0] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            q @ (b'\'' | b'"') => {
                // Past the closing quote; a backslash escapes the next byte.
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Where a raw block whose body starts at `from` ends: past its `{% endraw %}`.
fn end_of_raw(b: &[u8], from: usize) -> usize {
    let mut i = from;
    while let Some(at) = find(b, i, b"{%") {
        i = at + 2;
        if let Some((n, _)) = basic_tag(&b[i..], b"endraw", true) {
            return i + n;
        }
    }
    b.len()
}
