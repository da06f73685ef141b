from hypothesis import strategies as st

# Any text a user might put in a value that validate accepts, shell metacharacters, quotes, %, $() and ';'
# included: everything but what the rules refuse in every string (schema.REFUSED_CATEGORIES: control
# characters such as newline, tab, NUL; line separators; invisible format characters), the pasted look-alike
# characters, leading or trailing blanks, and what cannot be encoded (surrogates).
_REFUSED = "\u00a0\u200b\u2013\u2014\u201c\u201d"
_ONE_LINE = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"), blacklist_characters=_REFUSED)
NASTY = st.text(alphabet=_ONE_LINE, min_size=1, max_size=40).filter(lambda s: s == s.strip()) | st.sampled_from(
    ["a b", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "a;b", "x && y", "--not-a-flag", "-", "${HOME}",
     "back\\slash", "trailing\\", "*", "~root", "!event", "#comment", "100%", "%n%i%%", "a=b", "ExecStartPre=/bin/id"])
SERVED_NAME = NASTY.filter(lambda s: ":" not in s)

# Text that must never reach a host as it is: each holds a character validate refuses in every string.
LINE_BREAKING = st.sampled_from(["new\nline", "x\nExecStartPre=/bin/touch /tmp/pwned", "cr\rreturn", "tab\there", "nul\x00byte",
                                 "esc\x1b[31m", "del\x7f", "nel\x85", "ls\u2028sep", "ps\u2029sep", "bidi\u202eevil", "bom\ufeff"])
