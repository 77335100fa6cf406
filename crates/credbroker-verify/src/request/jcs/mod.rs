//! I-JSON (RFC 7493) parsing and RFC 8785 (JCS) serialisation, for the
//! bodies a request binding hashes ([`super`]).
//!
//! [`parse`] reads RFC 8259 JSON text and refuses what is not I-JSON, and
//! what would make two different texts one canonical form: a duplicate
//! member name, a lone surrogate (escaped or not), a number that is not
//! the shortest text of its IEEE 754 double (more digits than the double
//! holds, `9007199254740993`, `1e400`), a magnitude above 2^53 - 1 (every
//! double that large is an integer, beyond I-JSON's exact ones), and
//! nesting deeper than [`MAX_DEPTH`]. [`Json::canonical`] writes RFC 8785's
//! form: members sorted by their names' UTF-16 code units, strings escaped
//! as ECMAScript's `JSON.stringify`, numbers as ECMAScript's
//! `Number.prototype.toString`, no whitespace.

use std::fmt::Write as _;

/// The deepest nesting of arrays and objects a bound body may have.
pub const MAX_DEPTH: usize = 32;

/// The largest integer every I-JSON reader holds exactly (2^53 - 1).
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// Why a text is not I-JSON (or not JSON at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IJsonError {
    /// Not JSON text (RFC 8259), or not UTF-8.
    #[error("the body is not JSON text in UTF-8")]
    Syntax,
    /// An object names a member twice (RFC 7493 section 2.3).
    #[error("an object has two members of one name")]
    DuplicateKey,
    /// A string holds a lone surrogate (RFC 7493 section 2.1).
    #[error("a string holds a lone surrogate")]
    LoneSurrogate,
    /// A number is not exactly its IEEE 754 double's shortest text, or an
    /// integer is beyond ±(2^53 - 1) (RFC 7493 section 2.2).
    #[error("a number is not exactly representable as an IEEE 754 double within I-JSON's range")]
    Number,
    /// Arrays and objects nest deeper than [`MAX_DEPTH`].
    #[error("the body nests arrays and objects too deeply")]
    TooDeep,
}

/// A parsed I-JSON value. Object members keep their order in the text
/// (each name once); [`Json::canonical`] sorts them.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number (its double).
    Number(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, members in the text's order.
    Object(Vec<(String, Json)>),
}

impl Json {
    /// The RFC 8785 (JCS) serialisation.
    pub fn canonical(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&number_to_string(*n).unwrap_or_default()),
            Json::String(s) => write_string(s, out),
            Json::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Object(members) => {
                let mut sorted: Vec<&(String, Json)> = members.iter().collect();
                sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                out.push('{');
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

/// A string as RFC 8785 section 3.2.2.2 writes it (ECMAScript's
/// `JSON.stringify`): `"` and `\` escaped, `\b \t \n \f \r` by letter,
/// other controls as lower-case `\u00xx`, everything else as it is.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ECMAScript's `Number.prototype.toString` of a finite double (RFC 8785
/// section 3.2.2.3); `None` for NaN and the infinities, which JSON cannot
/// hold. The shortest digits that read back as the double come from
/// `ryu`; their placement is ECMAScript's (ECMA-262, Number::toString).
pub fn number_to_string(x: f64) -> Option<String> {
    if !x.is_finite() {
        return None;
    }
    if x == 0.0 {
        return Some("0".into());
    }
    let mut buf = ryu::Buffer::new();
    let (digits, n) = decimal_parts(buf.format_finite(x.abs()))?;
    let k = digits.len() as i32;
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        let _ = write!(out, "e{}{}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    Some(out)
}

/// A non-negative decimal text (`123.45`, `1e-7`, `1.5E+30`) as its
/// significant digits (no leading or trailing zeros) and the position `n`
/// of the decimal point after the first of them: value = 0.d1d2... x
/// 10^n. `None` for zero or text that is not a decimal.
fn decimal_parts(text: &str) -> Option<(String, i32)> {
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = int.chars().chain(frac.chars()).collect();
    if !all.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let lead = all.bytes().take_while(|&b| b == b'0').count();
    let digits = all[lead..].trim_end_matches('0');
    if digits.is_empty() {
        return None;
    }
    let n = (int.len() as i32)
        .checked_sub(lead as i32)?
        .checked_add(exp)?;
    Some((digits.to_string(), n))
}

/// Parses `text` as I-JSON (see the module doc for what it refuses).
pub fn parse(text: &[u8]) -> Result<Json, IJsonError> {
    parse_with(text, true)
}

/// [`parse`], with `exact_numbers` false accepting any number that reads
/// as a finite double (RFC 8785's own examples write numbers with more
/// digits than their doubles hold): for the tests against the RFC only.
#[doc(hidden)]
pub fn parse_with(text: &[u8], exact_numbers: bool) -> Result<Json, IJsonError> {
    let text = std::str::from_utf8(text).map_err(|_| IJsonError::Syntax)?;
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
        exact_numbers,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(IJsonError::Syntax);
    }
    Ok(v)
}

/// The JCS form of an I-JSON text.
pub fn canonicalize(text: &[u8]) -> Result<String, IJsonError> {
    parse(text).map(|v| v.canonical())
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    exact_numbers: bool,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &[u8]) -> Result<(), IJsonError> {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(IJsonError::Syntax)
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, IJsonError> {
        match self.s.get(self.i) {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Json::String),
            Some(b't') => self.eat(b"true").map(|_| Json::Bool(true)),
            Some(b'f') => self.eat(b"false").map(|_| Json::Bool(false)),
            Some(b'n') => self.eat(b"null").map(|_| Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(IJsonError::Syntax),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, IJsonError> {
        if depth > MAX_DEPTH {
            return Err(IJsonError::TooDeep);
        }
        self.i += 1;
        let mut members: Vec<(String, Json)> = Vec::new();
        let mut names = std::collections::HashSet::new();
        self.ws();
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return Err(IJsonError::Syntax);
            }
            let name = self.string()?;
            if !names.insert(name.clone()) {
                return Err(IJsonError::DuplicateKey);
            }
            self.ws();
            self.eat(b":")?;
            self.ws();
            let v = self.value(depth)?;
            members.push((name, v));
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(IJsonError::Syntax),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, IJsonError> {
        if depth > MAX_DEPTH {
            return Err(IJsonError::TooDeep);
        }
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b']') {
            self.i += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth)?);
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(IJsonError::Syntax),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, IJsonError> {
        let h = self.s.get(self.i..self.i + 4).ok_or(IJsonError::Syntax)?;
        let h = std::str::from_utf8(h).map_err(|_| IJsonError::Syntax)?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(IJsonError::Syntax);
        }
        self.i += 4;
        u32::from_str_radix(h, 16).map_err(|_| IJsonError::Syntax)
    }

    fn string(&mut self) -> Result<String, IJsonError> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while let Some(&b) = self.s.get(self.i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            // The text is UTF-8, and the run stops at ASCII bytes only.
            out.push_str(&self.text[start..self.i]);
            match self.s.get(self.i) {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let e = *self.s.get(self.i).ok_or(IJsonError::Syntax)?;
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.escaped_char()?,
                        _ => return Err(IJsonError::Syntax),
                    };
                    out.push(c);
                }
                // A raw control character, or the end of the text.
                _ => return Err(IJsonError::Syntax),
            }
        }
    }

    /// The character of a `\uXXXX` escape (after its `\u`), with its low
    /// surrogate's escape when it is a high one.
    fn escaped_char(&mut self) -> Result<char, IJsonError> {
        let u = self.hex4()?;
        match u {
            0xD800..=0xDBFF => {
                if !self.s[self.i..].starts_with(b"\\u") {
                    return Err(IJsonError::LoneSurrogate);
                }
                self.i += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(IJsonError::LoneSurrogate);
                }
                let c = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
                char::from_u32(c).ok_or(IJsonError::LoneSurrogate)
            }
            0xDC00..=0xDFFF => Err(IJsonError::LoneSurrogate),
            u => char::from_u32(u).ok_or(IJsonError::Syntax),
        }
    }

    fn number(&mut self) -> Result<Json, IJsonError> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(IJsonError::Syntax),
        }
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            if !matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                return Err(IJsonError::Syntax);
            }
            self.digits();
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                return Err(IJsonError::Syntax);
            }
            self.digits();
        }
        let text = &self.text[start..self.i];
        // Rust's parse rounds correctly (to the nearest double).
        let x: f64 = text.parse().map_err(|_| IJsonError::Syntax)?;
        if !x.is_finite() {
            return Err(IJsonError::Number);
        }
        if self.exact_numbers {
            if x.fract() == 0.0 && x.abs() > MAX_SAFE_INTEGER {
                return Err(IJsonError::Number);
            }
            let unsigned = text.trim_start_matches('-');
            let written = decimal_parts(unsigned);
            let shortest = if x == 0.0 {
                None
            } else {
                decimal_parts(ryu::Buffer::new().format_finite(x.abs()))
            };
            if written != shortest {
                return Err(IJsonError::Number);
            }
        }
        // -0 is 0 in JCS.
        Ok(Json::Number(if x == 0.0 { 0.0 } else { x }))
    }

    fn digits(&mut self) {
        while matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
            self.i += 1;
        }
    }
}

#[cfg(test)]
mod tests;
