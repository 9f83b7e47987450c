//! Both surfaces, listed: every user-facing call of the crates.io path (a public function,
//! a method of a public trait, a trait implementation, a public struct, field or type
//! alias whose signature names a `reqwest_middleware` type) and of the astral fork's path
//! (one naming an `astral_reqwest_middleware` type), read from `src/`, against [`TWINS`],
//! the table of which is whose twin. A call that appears on one side with no row, a row
//! whose call is gone, or a twin that is not there fails the test, naming it.
//!
//! The scan reads the source text (comments, strings and `#[cfg(test)]` modules left out),
//! not rustdoc's JSON: a few milliseconds, no nightly toolchain, no feature needed. What it
//! counts as naming a type: a path through the crate (`reqwest_middleware::Error`) or a
//! name the file imports from it (`use reqwest_middleware::{ClientBuilder, Middleware}`).
//! What it cannot see: a signature a macro builds from pieces (the standalone middlewares'
//! `impl … Middleware for $stage` is seen, once, in the macro), a `pub use` of the crate's
//! items, and visibility beyond `pub` (a `pub fn` of a private module is listed too).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What stands on the fork's side for a call of the crates.io path.
#[derive(Debug, Clone, Copy)]
enum Twin {
    /// This call of the fork's path.
    Astral(&'static str),
    /// The same item serves the fork too (it is generic over the error, or the fork's
    /// types pass through it converted); why.
    Shared(&'static str),
    /// No twin, and why it cannot or need not have one.
    None(&'static str),
}

/// Every user-facing call of the crates.io path and its fork twin. Keep one row per call:
/// a new call of either path needs its twin and its row here.
const TWINS: &[(&str, Twin)] = &[
    // Building the stack (`stack::astral::AstralResilience` holds the fork's ways).
    (
        "Resilience::build",
        Twin::Astral("AstralResilience::build_astral"),
    ),
    (
        "Resilience::build_from",
        Twin::Astral("AstralResilience::build_from_astral"),
    ),
    (
        "Resilience::install",
        Twin::Astral("AstralResilience::install_astral"),
    ),
    (
        "Resilience::into_middlewares",
        Twin::Astral("AstralResilience::into_middlewares_astral"),
    ),
    (
        "Resilience::per_attempt",
        Twin::Astral("AstralResilience::per_attempt_astral"),
    ),
    (
        "StackBuilder::build",
        Twin::Astral("AstralStackBuilder::build"),
    ),
    (
        "StackBuilder::with_init",
        Twin::Astral("AstralStackBuilder::with_init"),
    ),
    (
        "StackBuilder::with_arc_init",
        Twin::Astral("AstralStackBuilder::with_arc_init"),
    ),
    (
        "StackBuilder::inside_transport_step",
        Twin::Astral("AstralStackBuilder::inside_transport_step"),
    ),
    // Every middleware and the stack are middlewares of both crates.
    (
        "impl Middleware for ResilienceMiddleware",
        Twin::Astral("impl Middleware for ResilienceMiddleware"),
    ),
    (
        "impl Middleware for $stage",
        Twin::Astral("impl Middleware for $stage"),
    ),
    (
        "impl Middleware for Composed",
        Twin::Astral("impl Middleware for Composed"),
    ),
    (
        "impl StackMiddleware for M",
        Twin::Astral("impl StackMiddleware for M"),
    ),
    // Errors.
    (
        "ResilienceError::from_middleware_error",
        Twin::Astral("ResilienceError::from_middleware_error_astral"),
    ),
    (
        "ResilienceError::find",
        Twin::Astral("ResilienceError::find_astral"),
    ),
    (
        "RetryError::into_last_error",
        Twin::Astral("RetryError::into_last_error_astral"),
    ),
    (
        "RetryError::last_error",
        Twin::None(
            "a reference into the RetryError, which holds the error as reqwest-middleware's: \
             the fork's by value is into_last_error_astral; reqwest_error, is_connect and \
             is_timeout answer by reference for both",
        ),
    ),
    // Event streams (`stream`).
    ("EventStream::new", Twin::Astral("EventStream::new_astral")),
    // send_with_history.
    (
        "impl SendWithHistory for RequestBuilder",
        Twin::Astral("impl SendWithHistory for RequestBuilder"),
    ),
    (
        "struct Exchange",
        Twin::Shared("generic over the error: Exchange<astral_reqwest_middleware::Error>"),
    ),
    // Implemented by users (a closure is a classifier too).
    (
        "AttemptClassifier::classify",
        Twin::Shared(CLASSIFIED_INSIDE),
    ),
    (
        "impl AttemptClassifier for F",
        Twin::Shared(CLASSIFIED_INSIDE),
    ),
    // Inside the crate (pub(crate) traits), listed because the scan cannot tell.
    (
        "impl ChainMember for Middleware",
        Twin::Astral("impl ChainMember for Middleware"),
    ),
    (
        "impl RestOfStack for Next",
        Twin::Astral("impl RestOfStack for Next"),
    ),
];

const CLASSIFIED_INSIDE: &str = "the breaker classifies inside the stack, where an attempt's \
    result is reqwest-middleware's for both clients (the fork's converted variant for variant); \
    a classifier reads it through the evidence, the status or chain::find";

#[test]
fn every_call_of_either_path_has_its_twin_in_the_table() {
    let found = Surface::scan(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut problems = Vec::new();
    let rows: BTreeSet<&str> = TWINS.iter().map(|(c, _)| *c).collect();
    for call in &found.crates {
        if !rows.contains(call.as_str()) {
            problems.push(format!(
                "`{call}` (crates.io path) has no row: add its astral twin and a row to TWINS"
            ));
        }
    }
    let mut twins = BTreeSet::new();
    for (call, twin) in TWINS {
        if !found.crates.contains(*call) {
            problems.push(format!(
                "row `{call}`: no such call of the crates.io path any more"
            ));
        }
        if let Twin::Shared(why) | Twin::None(why) = twin {
            assert!(
                why.len() > 20,
                "row `{call}`: say why it has no twin of its own"
            );
        }
        if let Twin::Astral(astral) = twin {
            twins.insert(*astral);
            if !found.astral.contains(*astral) {
                problems.push(format!(
                    "`{call}`'s twin `{astral}` is not in the fork's path"
                ));
            }
        }
    }
    for call in &found.astral {
        if !twins.contains(call.as_str()) {
            problems.push(format!(
                "`{call}` (fork path) is no twin of a call in TWINS: add the crates.io call it \
                 mirrors, or the one it lacks"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_scan_sees_a_new_call_on_either_side() {
    // The scan itself, on a file that gains a call of each path.
    let text = "use reqwest_middleware::Middleware;\n\
                pub struct Shiny;\n\
                impl Shiny {\n\
                    /// Takes `reqwest_middleware::Error` in a comment only.\n\
                    pub fn quiet(&self) {}\n\
                    pub fn wrap(m: std::sync::Arc<dyn Middleware>) -> Self { Shiny }\n\
                    pub fn wrap_fork(m: astral_reqwest_middleware::Error) -> Self { Shiny }\n\
                    pub(crate) fn inner(e: reqwest_middleware::Error) {}\n\
                }\n\
                pub type Answer = reqwest_middleware::Result<()>;\n\
                #[cfg(test)]\n\
                mod tests { pub fn t(e: reqwest_middleware::Error) {} }\n";
    let mut found = Surface::default();
    found.read(text);
    assert_eq!(
        found.crates.iter().collect::<Vec<_>>(),
        ["Shiny::wrap", "type Answer"],
        "{found:?}"
    );
    assert_eq!(
        found.astral.iter().collect::<Vec<_>>(),
        ["Shiny::wrap_fork"]
    );
}

/// The calls found on each side.
#[derive(Debug, Default)]
struct Surface {
    crates: BTreeSet<String>,
    astral: BTreeSet<String>,
}

/// A block the scan tracks: an `impl` (its self type) or a trait (public or not).
struct Block {
    start: usize,
    end: usize,
    /// The self type's name, or the trait's.
    name: String,
    public_trait: bool,
}

impl Surface {
    fn scan(src: &Path) -> Surface {
        let mut files = Vec::new();
        collect(src, &mut files);
        assert!(files.len() > 20, "no sources under {}", src.display());
        let mut surface = Surface::default();
        for file in files {
            surface.read(&std::fs::read_to_string(&file).unwrap());
        }
        surface
    }

    fn read(&mut self, text: &str) {
        let text = cut_test_modules(&strip(text));
        let imports = Imports::of(&text);
        let blocks = blocks(&text);
        let mut note = |item: String, sig: &str| {
            if imports.names_crates(sig) {
                self.crates.insert(item.clone());
            }
            if imports.names_astral(sig) {
                self.astral.insert(item);
            }
        };
        for at in words(&text, "fn") {
            let Some(name) = ident_after(&text, at + 2) else {
                continue;
            };
            let sig = &text[at..end_of_signature(&text, at)];
            let inside = blocks
                .iter()
                .filter(|b| b.start < at && at < b.end)
                .max_by_key(|b| b.start);
            let public = text[..at].trim_end().ends_with("pub")
                || text[..at].trim_end().ends_with("pub async")
                || inside.is_some_and(|b| b.public_trait);
            if !public {
                continue;
            }
            let item = match inside {
                Some(b) => format!("{}::{name}", b.name),
                None => format!("fn {name}"),
            };
            note(item, sig);
        }
        for at in words(&text, "impl").filter(|&at| item_position(&text, at)) {
            let header = &text[at..end_of_signature(&text, at)];
            if let Some(item) = impl_item(header) {
                note(item, header);
            }
        }
        for at in words(&text, "type").filter(|&at| text[..at].trim_end().ends_with("pub")) {
            let Some(name) = ident_after(&text, at + 4) else {
                continue;
            };
            note(
                format!("type {name}"),
                &text[at..end_of_signature(&text, at)],
            );
        }
        for at in words(&text, "struct") {
            if !text[..at].trim_end().ends_with("pub") {
                continue;
            }
            let Some(name) = ident_after(&text, at + 6) else {
                continue;
            };
            note(format!("struct {name}"), &public_parts(&text, at));
        }
    }
}

/// The names a file imports from each crate.
struct Imports {
    crates: Vec<String>,
    astral: Vec<String>,
}

impl Imports {
    fn of(text: &str) -> Imports {
        let mut imports = Imports {
            crates: Vec::new(),
            astral: Vec::new(),
        };
        for at in words(text, "use") {
            let end = text[at..].find(';').map_or(text.len(), |e| at + e);
            let path = text[at + 3..end].trim();
            let (list, astral) = if let Some(rest) = path.strip_prefix("reqwest_middleware::") {
                (rest, false)
            } else if let Some(rest) = path.strip_prefix("astral_reqwest_middleware::") {
                (rest, true)
            } else {
                continue;
            };
            let names = list
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .filter_map(|n| n.split_whitespace().last())
                .map(str::to_owned);
            if astral {
                imports.astral.extend(names);
            } else {
                imports.crates.extend(names);
            }
        }
        imports
    }

    fn names_astral(&self, sig: &str) -> bool {
        sig.contains("astral_reqwest_middleware::") || self.astral.iter().any(|n| has_word(sig, n))
    }

    fn names_crates(&self, sig: &str) -> bool {
        let sig = without_astral_paths(sig);
        sig.contains("reqwest_middleware::") || self.crates.iter().any(|n| has_word(&sig, n))
    }
}

/// `sig` without its `astral_reqwest_middleware::…` paths.
fn without_astral_paths(sig: &str) -> String {
    let mut out = String::new();
    let mut rest = sig;
    while let Some(i) = rest.find("astral_reqwest_middleware::") {
        out.push_str(&rest[..i]);
        rest = &rest[i + "astral_reqwest_middleware::".len()..];
        rest = rest.trim_start_matches(is_ident);
    }
    out.push_str(rest);
    out
}

/// `impl … for Type` / `impl Type`: "impl Trait for Type" when it implements a trait
/// (the surface is the implementation), `None` for an inherent impl (its methods count).
fn impl_item(header: &str) -> Option<String> {
    let rest = skip_generics(header["impl".len()..].trim_start());
    let rest = before_where(rest);
    let (tr, ty) = split_for(rest)?;
    Some(format!(
        "impl {} for {}",
        last_segment(tr),
        last_segment(ty)
    ))
}

/// An impl header without its `where` clause.
fn before_where(header: &str) -> &str {
    words(header, "where")
        .next()
        .map_or(header, |w| &header[..w])
}

/// `Trait for Type` split at the `for` outside angle brackets.
fn split_for(s: &str) -> Option<(&str, &str)> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ if depth == 0 && s[i..].starts_with(" for ") => {
                return Some((&s[..i], &s[i + 5..]));
            }
            _ => {}
        }
    }
    None
}

/// The name of a path's last segment, generics left out: `a::B<C>` is `B`.
fn last_segment(path: &str) -> String {
    let path = path.trim().trim_start_matches("dyn ");
    let head = path.split('<').next().unwrap_or(path).trim();
    head.rsplit("::").next().unwrap_or(head).trim().to_owned()
}

fn skip_generics(s: &str) -> &str {
    if !s.starts_with('<') {
        return s;
    }
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return s[i + 1..].trim_start();
                }
            }
            _ => {}
        }
    }
    s
}

/// Every `impl` block and trait of `text`, with its extent.
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let items = words(text, "impl").chain(words(text, "trait"));
    for at in items.filter(|&at| item_position(text, at)) {
        let end = end_of_signature(text, at);
        if text.as_bytes().get(end) != Some(&b'{') {
            continue;
        }
        let header = &text[at..end];
        let (name, public_trait) = if header.starts_with("trait") {
            let name = ident_after(text, at + 5).unwrap_or_default();
            let public = text[..at].trim_end().ends_with("pub");
            (name, public)
        } else {
            let rest = skip_generics(header["impl".len()..].trim_start());
            let rest = before_where(rest);
            let ty = split_for(rest).map_or(rest, |(_, ty)| ty);
            (last_segment(ty), false)
        };
        out.push(Block {
            start: at,
            end: matching_brace(text, end),
            name,
            public_trait,
        });
    }
    out
}

/// A public struct's header and its public fields.
fn public_parts(text: &str, at: usize) -> String {
    let end = end_of_signature(text, at);
    let mut parts = text[at..end].to_owned();
    if text.as_bytes().get(end) == Some(&b'{') {
        let body = &text[end + 1..matching_brace(text, end)];
        for field in body
            .split(',')
            .filter(|f| f.trim_start().starts_with("pub "))
        {
            parts.push_str(field);
        }
    }
    parts
}

/// Where an item's signature ends: its `{` or `;` (or `(` of a tuple struct).
fn end_of_signature(text: &str, at: usize) -> usize {
    let mut depth = 0i32;
    for (i, c) in text[at..].char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            '{' | ';' if depth == 0 => return at + i,
            _ => {}
        }
    }
    text.len()
}

fn matching_brace(text: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// Whether the `impl` or `trait` at `at` starts an item (not `-> impl Future`, `impl
/// Trait` in an argument, `dyn Trait`'s bound).
fn item_position(text: &str, at: usize) -> bool {
    let before = text[..at].trim_end();
    before.is_empty()
        || before.ends_with(['}', ';', '{', ']', ')'])
        || before.ends_with("pub")
        || before.ends_with("unsafe")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

/// The positions of `word` standing alone in `text`.
fn words<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    text.match_indices(word).map(|(i, _)| i).filter(move |&i| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

fn has_word(text: &str, word: &str) -> bool {
    words(text, word).any(|i| !text[..i].ends_with("::"))
}

fn ident_after(text: &str, at: usize) -> Option<String> {
    let rest = text[at..].trim_start();
    let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
    (!name.is_empty()).then_some(name)
}

/// `text` without comments, string literals and character literals (each replaced by a
/// space, so nothing else moves together).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
            out.push(' ');
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && (b.get(i + 1) == Some(&b'\\') || b.get(i + 2) == Some(&b'\'')) {
            // A character literal ('"', '\n'), not a lifetime.
            i += if b[i + 1] == b'\\' {
                text[i + 2..].find('\'').map_or(b.len() - i, |e| e + 3)
            } else {
                3
            };
            out.push(' ');
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `text` without its `#[cfg(test)] mod … { … }` blocks.
fn cut_test_modules(text: &str) -> String {
    let mut out = text.to_owned();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = out[at + "#[cfg(test)]".len()..].trim_start();
        let end = if rest.starts_with("mod ") {
            let open = out[at..].find('{').map_or(out.len(), |o| at + o);
            matching_brace(&out, open) + 1
        } else {
            at + "#[cfg(test)]".len()
        };
        out.replace_range(at..end.min(out.len()), " ");
    }
    out
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}
