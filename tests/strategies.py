from hypothesis import strategies as st

# Any text a user might put in a value, shell metacharacters included; minus what the rules refuse
# (NUL, pasted look-alike characters) and what cannot be encoded (surrogates).
_REFUSED = "\x00\u00a0\u200b\u2013\u2014\u201c\u201d"
NASTY = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=_REFUSED),
    min_size=1, max_size=40,
) | st.sampled_from(["a b", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "a;b", "x && y", "--not-a-flag",
                     "-", "${HOME}", "back\\slash", "new\nline", "tab\there", "*", "~root", "!event", "#comment"])
SERVED_NAME = NASTY.filter(lambda s: ":" not in s)
