//! The target's chat template, rendered as transformers renders it: Jinja2 with
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python string and dict methods
//! (minijinja-contrib's pycompat), `raise_exception`, `strftime_now`, a `tojson` that writes
//! what Python's `json.dumps` writes, and the special tokens of `tokenizer_config.json` as
//! variables.
//!
//! `{% generation %}...{% endgeneration %}` blocks (transformers' `AssistantTracker`) are
//! rewritten to a call block of a Rust function that wraps what the block renders in two
//! private noncharacters; after rendering, the markers are removed and their positions are
//! the generation spans. The function is a global rather than a macro in the template text
//! because any text put before the template changes how `trim_blocks` and `lstrip_blocks`
//! treat its first characters.

use std::ops::Range;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::conversation::Message;
use crate::error::PrepareError;

mod generation_tags;
pub use generation_tags::rewrite_generation;

/// Opens a generation span in the rendered text (U+FDD0, a noncharacter).
pub const OPEN: char = '\u{FDD0}';
/// Closes a generation span (U+FDD1).
pub const CLOSE: char = '\u{FDD1}';

const GENERATION_FN: &str = "__dflash_generation";
const NAME: &str = "chat_template";

/// The special-token variables transformers passes to every render.
const SPECIAL_TOKENS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

pub struct ChatTemplate {
    env: Environment<'static>,
    has_generation: bool,
    specials: Vec<(&'static str, String)>,
    origin: PathBuf,
}

/// One rendering: the text (markers removed) and the byte ranges the generation blocks
/// rendered, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub generation: Vec<Range<usize>>,
}

impl ChatTemplate {
    /// The chat template of a target directory: `chat_template.jinja` where it exists (what
    /// transformers writes and prefers), else `tokenizer_config.json`'s `chat_template` (a
    /// string, or a list of named templates whose `default` is taken), with the special tokens
    /// of `tokenizer_config.json`.
    pub fn from_target_dir(dir: &Path) -> Result<Self, PrepareError> {
        Self::load(dir, None)
    }

    /// The template in `template` (a Jinja file, e.g. the target's template with
    /// `{% generation %}` blocks added) with the special tokens of `DIR/tokenizer_config.json`.
    pub fn from_target_dir_with(dir: &Path, template: &Path) -> Result<Self, PrepareError> {
        Self::load(dir, Some(template))
    }

    fn load(dir: &Path, template: Option<&Path>) -> Result<Self, PrepareError> {
        let config_path = dir.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| PrepareError::target(&config_path, format!("cannot read: {e}")))?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| PrepareError::target(&config_path, format!("invalid JSON: {e}")))?;
        let specials = SPECIAL_TOKENS
            .iter()
            .filter_map(|&k| special_token(config.get(k)?).map(|v| (k, v)))
            .collect();
        let jinja = dir.join("chat_template.jinja");
        if let Some(file) = template.or_else(|| jinja.is_file().then_some(jinja.as_path())) {
            let source = std::fs::read_to_string(file).map_err(|e| PrepareError::io(file, e))?;
            return Self::new(&source, specials, file.to_path_buf());
        }
        let source = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .map(str::to_string)
                .ok_or_else(|| {
                    PrepareError::target(
                        &config_path,
                        "chat_template is a list without a template named \"default\"",
                    )
                })?,
            _ => {
                return Err(PrepareError::target(
                    &config_path,
                    "no chat_template (and no chat_template.jinja beside it): the target \
                     cannot render conversations",
                ));
            }
        };
        Self::new(&source, specials, config_path)
    }

    /// A template from source; `origin` names it in errors.
    pub fn new(
        source: &str,
        specials: Vec<(&'static str, String)>,
        origin: PathBuf,
    ) -> Result<Self, PrepareError> {
        let (rewritten, has_generation) = rewrite_generation(source);
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| PrepareError::Template {
                    path: origin.clone(),
                    detail: e.to_string(),
                })?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<String, Error> {
            strftime_now(&fmt)
        });
        env.add_filter("tojson", tojson);
        // What `{% call __dflash_generation() %}` renders: its body between the markers.
        env.add_function(
            GENERATION_FN,
            |state: &mut State, kwargs: Kwargs| -> Result<Value, Error> {
                let caller: Value = kwargs.get("caller")?;
                kwargs.assert_all_used()?;
                let body = caller.call(state, &[])?;
                Ok(Value::from_safe_string(format!("{OPEN}{body}{CLOSE}")))
            },
        );
        env.add_template_owned(NAME, rewritten)
            .map_err(|e| PrepareError::Template {
                path: origin.clone(),
                detail: error_chain(&e),
            })?;
        Ok(ChatTemplate {
            env,
            has_generation,
            specials,
            origin,
        })
    }

    /// Whether the template marks assistant output with `{% generation %}` blocks.
    pub fn has_generation_blocks(&self) -> bool {
        self.has_generation
    }

    /// Where the template came from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Renders `messages` as transformers' `apply_chat_template(..., tokenize=False)` does.
    /// The error is the template's message (a `raise_exception`, an undefined operation).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Rendered, String> {
        let msgs: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content}))
            .collect();
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), serde_json::Value::Array(msgs));
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(add_generation_prompt),
        );
        for (k, v) in &self.specials {
            ctx.insert((*k).into(), serde_json::Value::String(v.clone()));
        }
        let tmpl = self.env.get_template(NAME).map_err(|e| error_chain(&e))?;
        let out = tmpl
            .render(Value::from(Serde(serde_json::Value::Object(ctx))))
            .map_err(|e| error_chain(&e))?;
        extract_spans(out)
    }
}

/// `bos_token` and friends: a string, or an AddedToken object with `content`.
fn special_token(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn error_chain(e: &Error) -> String {
    let mut s = e.to_string();
    let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Removes the markers, returning the text and the byte ranges between them.
fn extract_spans(out: String) -> Result<Rendered, String> {
    if !out.contains([OPEN, CLOSE]) {
        return Ok(Rendered {
            text: out,
            generation: Vec::new(),
        });
    }
    let mut text = String::with_capacity(out.len());
    let mut spans = Vec::new();
    let mut open: Option<usize> = None;
    for c in out.chars() {
        match c {
            OPEN => {
                if open.is_some() {
                    return Err("nested {% generation %} blocks".into());
                }
                open = Some(text.len());
            }
            CLOSE => {
                let start = open.take().ok_or("unbalanced {% generation %} block")?;
                spans.push(start..text.len());
            }
            c => text.push(c),
        }
    }
    if open.is_some() {
        return Err("unbalanced {% generation %} block".into());
    }
    Ok(Rendered {
        text,
        generation: spans,
    })
}

/// Python's `json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`, the
/// `tojson` transformers installs (minijinja's own escapes HTML characters and spaces
/// differently).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    py_json(&v, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    sort: bool,
    level: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                py_json(x, indent, sort, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(o) if !o.is_empty() => {
            let mut items: Vec<(&String, &J)> = o.iter().collect();
            if sort {
                items.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in items.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                py_json(x, indent, sort, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `strftime_now(format)` over UTC: `%Y %m %d %b %B %H %M %S %%` (the ones chat templates
/// use, for "today's date" lines).
fn strftime_now(fmt: &str) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(fmt, secs)
}

fn strftime(fmt: &str, secs: i64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Role;

    fn msgs(pairs: &[(Role, &str)]) -> Vec<Message> {
        pairs
            .iter()
            .map(|&(role, c)| Message {
                role,
                content: c.into(),
            })
            .collect()
    }

    #[test]
    fn generation_tags_are_rewritten_keeping_whitespace_control() {
        let (s, found) = rewrite_generation("a{%- generation -%}b{% endgeneration %}c{% if x %}");
        assert!(found);
        assert_eq!(
            s,
            "a{%- call __dflash_generation() -%}b{% endcall %}c{% if x %}"
        );
        let (s, found) = rewrite_generation("{{ x }}{% if generation %}{% endif %}");
        assert!(!found);
        assert_eq!(s, "{{ x }}{% if generation %}{% endif %}");
    }

    #[test]
    fn generation_tags_outside_statements_are_left_as_text() {
        // Comments, raw blocks (with whitespace control), string literals in expressions and
        // statements (with escaped quotes, and `%}` or `}}` inside), dict literals whose `}}`
        // does not end the expression; unterminated constructs are copied as they are.
        for src in [
            "{# {% generation %} #}{#- {% endgeneration %} -#}",
            "{% raw %}{% generation %}{% endraw %}{%- raw -%}{% endgeneration %}{%- endraw %}",
            "{{ '{% generation %}' }}{{ \"}}{% generation %}\" }}",
            "{% set x = 'a\\'%}{% generation %}' %}{{ {'a': {'b': '{% endgeneration %}'}} }}",
            "{{ x -}}{{ '{% generation %}' +}}",
            "{# {% generation %}",
            "{% raw %}{% generation %}",
            "{{ '{% generation %}",
            "{% generationx %}{% generation x %}{% end generation %}",
        ] {
            assert_eq!(rewrite_generation(src), (src.to_string(), false), "{src}");
        }
        let (s, found) = rewrite_generation(
            "{# #}{% raw %}{% generation %}{% endraw %}{{ '%}' }}é{%+generation+%}{%endgeneration-%}",
        );
        assert!(found);
        assert_eq!(
            s,
            "{# #}{% raw %}{% generation %}{% endraw %}{{ '%}' }}é\
             {%+ call __dflash_generation() +%}{% endcall -%}"
        );
    }

    #[test]
    fn generation_spans_are_recorded_and_markers_removed() {
        let src = "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}\
                   {% generation %}{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}\
                   {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, vec![], "t".into()).unwrap();
        assert!(t.has_generation_blocks());
        let r = t
            .render(
                &msgs(&[
                    (Role::User, "hi"),
                    (Role::Assistant, "yo"),
                    (Role::User, "x"),
                    (Role::Assistant, "z"),
                ]),
                false,
            )
            .unwrap();
        // trim_blocks eats the newline after `{% endif %}` (Jinja2 renders the same).
        assert_eq!(r.text, "user: hiassistant: yo!user: xassistant: z!");
        let spans: Vec<&str> = r.generation.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, ["yo!", "z!"]);
    }

    #[test]
    fn jinja2_behaviour_transformers_relies_on() {
        // trim_blocks + lstrip_blocks, Python string methods, loop controls, special tokens,
        // raise_exception; the expected text is what Jinja2 renders with transformers'
        // settings.
        let src = "{{ bos_token }}\n  {% for m in messages %}\n    {% if m.content.startswith('skip') %}{% continue %}{% endif %}\n{{ m.content.strip().upper() }}|\n{% endfor %}\n{% if messages|length > 3 %}{{ raise_exception('too many') }}{% endif %}";
        let t = ChatTemplate::new(src, vec![("bos_token", "<s>".into())], "t".into()).unwrap();
        assert!(!t.has_generation_blocks());
        let r = t
            .render(
                &msgs(&[
                    (Role::User, " a "),
                    (Role::Assistant, "skip me"),
                    (Role::User, "b"),
                ]),
                false,
            )
            .unwrap();
        assert_eq!(r.text, "<s>\nA|\nB|\n");
        let e = t.render(&msgs(&[(Role::User, "a"); 4]), false).unwrap_err();
        assert!(e.contains("too many"), "{e}");
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let t = ChatTemplate::new(
            "{{ {'a': [1, 'é<'], 'b': none} | tojson }}|{{ [1] | tojson(indent=2) }}",
            vec![],
            "t".into(),
        )
        .unwrap();
        let r = t.render(&[], false).unwrap();
        assert_eq!(r.text, "{\"a\": [1, \"é<\"], \"b\": null}|[\n  1\n]");
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            strftime("%d %b %Y %B %H:%M:%S %%", 1_709_211_909).unwrap(),
            "29 Feb 2024 February 13:05:09 %"
        );
        assert!(strftime("%Q", 0).is_err());
    }

    #[test]
    fn a_template_that_does_not_compile_names_its_file() {
        let e = ChatTemplate::new("{% if %}", vec![], "dir/tokenizer_config.json".into())
            .err()
            .unwrap();
        let s = e.to_string();
        assert!(
            s.contains("dir/tokenizer_config.json") && s.contains("does not compile"),
            "{s}"
        );
    }
}
