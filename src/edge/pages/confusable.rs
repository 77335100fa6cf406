//! Text on the approval page that can be misread (docs/APPROVALS.md): the
//! characters of a detail value that look like others, each marked with
//! its script, so that `pаypal.com` with a Cyrillic `а` does not pass for
//! the Latin one (UTS #39, through the `unicode-security` crate).
//!
//! A value is looked at word by word (runs of characters between
//! whitespace), since a sentence may mix scripts where a word should not.
//! Marked are:
//! - in a word that is not single-script (UTS #39 mixed-script detection,
//!   with the augmented script sets, so Japanese or Korean text is one
//!   script), each character whose script set does not meet the one of
//!   the word's most frequent script: the odd ones out;
//! - in a single-script word that is not ASCII but whose UTS #39 skeleton
//!   is (whole-script confusable with ASCII text: `раураl` in Cyrillic,
//!   or fullwidth letters), each character that is not ASCII;
//! - combining marks that belong to no script of their own (the Inherited
//!   ones, such as U+0301, which stack on any letter), and every combining
//!   mark of a value that is not in NFC; they are also shown by name;
//! - in a value that is not in NFC, any other character NFC would change
//!   (such as U+212B ANGSTROM SIGN).
//!
//! A mark is information for the person, never a refusal: text in one
//! script other than Latin (Cyrillic, Greek, Han, Devanagari...) is shown
//! unmarked unless a word of it reads as ASCII.

use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;
use unicode_script::{Script, UnicodeScript};
use unicode_security::mixed_script::AugmentedScriptSet;
use unicode_security::MixedScript;

/// Why a character is marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// Of another script than the rest of its word.
    OtherScript,
    /// Part of a word of another script that reads as ASCII text.
    LooksAscii,
    /// A combining mark (shown by name).
    Combining,
    /// Changed by NFC: the value is not in its normal form.
    NotNfc,
}

impl Why {
    /// The page's explanation (the mark's title).
    pub(crate) fn text(self) -> &'static str {
        match self {
            Why::OtherScript => "a letter of another script than the rest of the word",
            Why::LooksAscii => "letters of another script that look like Latin (ASCII) ones",
            Why::Combining => "a combining mark, which changes the letter before it",
            Why::NotNfc => "a character that has another, normal form",
        }
    }
}

/// One character's mark: its script's name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The script's name (`Cyrillic`), or `combining` for a mark of no
    /// script of its own.
    pub label: String,
    /// Why it is marked.
    pub why: Why,
}

fn script_name(c: char) -> String {
    match c.script() {
        Script::Inherited | Script::Common | Script::Unknown if is_combining_mark(c) => {
            "combining".into()
        }
        s => s.full_name().to_string(),
    }
}

fn mark(c: char, why: Why) -> Option<Mark> {
    Some(Mark {
        label: script_name(c),
        why,
    })
}

/// The mark of each character of `s`, in order (`None`: not marked).
pub(crate) fn marks(s: &str) -> Vec<Option<Mark>> {
    let chars: Vec<char> = s.chars().collect();
    let nfc = unicode_normalization::is_nfc(s);
    let mut out: Vec<Option<Mark>> = chars
        .iter()
        .map(|&c| {
            if is_combining_mark(c) && (!nfc || c.script() == Script::Inherited) {
                mark(c, Why::Combining)
            } else if !nfc && std::iter::once(c).nfc().ne(std::iter::once(c)) {
                mark(c, Why::NotNfc)
            } else {
                None
            }
        })
        .collect();
    let mut start = 0;
    while start < chars.len() {
        if chars[start].is_whitespace() {
            start += 1;
            continue;
        }
        let end = chars[start..]
            .iter()
            .position(|c| c.is_whitespace())
            .map_or(chars.len(), |n| start + n);
        mark_word(&chars[start..end], &mut out[start..end]);
        start = end;
    }
    out
}

/// Marks the confusable characters of one word (see the module's list).
fn mark_word(word: &[char], out: &mut [Option<Mark>]) {
    let text: String = word.iter().collect();
    if !text.as_str().is_single_script() {
        let Some(base) = base_set(word) else {
            return;
        };
        for (c, m) in word.iter().zip(out.iter_mut()) {
            let mut set = AugmentedScriptSet::for_char(*c);
            set.intersect_with(base);
            if set.is_empty() && m.is_none() {
                *m = mark(*c, Why::OtherScript);
            }
        }
    } else if word.iter().any(|c| visible_non_ascii(*c))
        && unicode_security::skeleton(&text).all(|c| c.is_ascii())
    {
        for (c, m) in word.iter().zip(out.iter_mut()) {
            if visible_non_ascii(*c) && m.is_none() {
                *m = mark(*c, Why::LooksAscii);
            }
        }
    }
}

/// Not ASCII, and not a code point the page shows by name anyway (the
/// skeleton drops the invisible ones, so `paid` with a zero-width space
/// reads as ASCII; the name already says what it is).
fn visible_non_ascii(c: char) -> bool {
    !c.is_ascii() && !super::approvals::shown_by_name(c)
}

/// The script set of the word's most frequent script (the first of equals),
/// counting only characters of one script (not Common or Inherited).
fn base_set(word: &[char]) -> Option<AugmentedScriptSet> {
    let mut counts: Vec<(Script, usize, char)> = Vec::new();
    for &c in word {
        let s = c.script();
        if matches!(s, Script::Common | Script::Inherited | Script::Unknown) {
            continue;
        }
        match counts.iter_mut().find(|(t, _, _)| *t == s) {
            Some((_, n, _)) => *n += 1,
            None => counts.push((s, 1, c)),
        }
    }
    let mut best: Option<(usize, char)> = None;
    for (_, n, c) in counts {
        if best.is_none_or(|(m, _)| n > m) {
            best = Some((n, c));
        }
    }
    best.map(|(_, c)| AugmentedScriptSet::for_char(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(s: &str) -> Vec<(char, String, Why)> {
        s.chars()
            .zip(marks(s))
            .filter_map(|(c, m)| m.map(|m| (c, m.label, m.why)))
            .collect()
    }

    #[test]
    fn a_cyrillic_letter_in_a_latin_word_is_marked_with_its_script() {
        assert_eq!(
            marked("pay p\u{430}ypal.com"),
            vec![('\u{430}', "Cyrillic".to_string(), Why::OtherScript)]
        );
        // The control: the same text in Latin alone.
        assert!(marked("pay paypal.com").is_empty());
    }

    #[test]
    fn a_whole_word_of_another_script_that_reads_as_ascii_is_marked() {
        // "раура1" in Cyrillic letters (and an ASCII digit).
        let m = marked("\u{440}\u{430}\u{443}\u{440}\u{430}1");
        assert_eq!(m.len(), 5, "{m:?}");
        assert!(m
            .iter()
            .all(|(_, l, w)| l == "Cyrillic" && *w == Why::LooksAscii));
        // Fullwidth Latin letters read as ASCII too.
        assert_eq!(marked("\u{ff50}\u{ff41}\u{ff59}").len(), 3);
    }

    #[test]
    fn combining_marks_and_values_not_in_nfc_are_marked() {
        // NFD: e + U+0301.
        assert_eq!(
            marked("cafe\u{301}"),
            vec![('\u{301}', "combining".to_string(), Why::Combining)]
        );
        // NFC: no mark.
        assert!(marked("caf\u{e9}").is_empty());
        // U+212B ANGSTROM SIGN, whose NFC is U+00C5.
        assert_eq!(
            marked("5 \u{212b}"),
            vec![('\u{212b}', "Latin".to_string(), Why::NotNfc)]
        );
    }

    #[test]
    fn invisible_code_points_are_left_to_their_names() {
        // Shown by name elsewhere; the ASCII text around them is not marked.
        assert!(marked("Invoice \u{202e}fdp.exe\u{202c} <b>paid</b>\u{200b}").is_empty());
        // The control: a Cyrillic letter beside one is still marked.
        assert_eq!(marked("\u{200b}\u{440}").len(), 1);
    }

    #[test]
    fn legitimate_text_in_one_script_is_not_marked() {
        for s in [
            "\u{418}\u{432}\u{430}\u{43d} \u{41f}\u{435}\u{442}\u{440}\u{43e}\u{432}", // Иван Петров
            "\u{6771}\u{4eac}\u{30bf}\u{30ef}\u{30fc}",                                // 東京タワー
            "\u{939}\u{93f}\u{928}\u{94d}\u{926}\u{940}",                              // हिन्दी
            "Z\u{fc}rich, 5 items",
            "\u{395}\u{3bb}\u{3bb}\u{3ac}\u{3b4}\u{3b1}", // Ελλάδα
        ] {
            assert!(marked(s).is_empty(), "{s}: {:?}", marked(s));
        }
    }
}
