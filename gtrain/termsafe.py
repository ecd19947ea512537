"""Remote text made safe for a terminal (and for an HTML page): what a job prints reaches the user's screen,
and a terminal obeys escape sequences. Window titles and the clipboard (OSC 0/2/52), hyperlinks (OSC 8),
clearing the screen (``ESC[2J``), the alternate screen (``ESC[?1049h``), cursor moves, device strings
(DCS/APC/PM/SOS) and single-character escapes (``ESC c``: reset) are all removed; other control characters
are shown as ``^X`` (tab and newline stay). Plain colours (SGR: ``ESC[`` digits and ``;`` ``m``) change
nothing but colour and are kept where asked (``keep_sgr``); a carriage return keeps what the line shows last
(a progress bar's latest state), so no line can overwrite the ``[node K rank R]`` prefix.
"""

from __future__ import annotations

import re

# ESC-introduced strings ended by BEL or ST (OSC ... BEL|ST; DCS/SOS/PM/APC ... ST); unterminated: to the end
_STRING = re.compile(r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])(?:[^\x07\x1b\x9c]|\x1b(?!\\))*(?:\x07|\x1b\\|\x9c|$)")
_CSI = re.compile(r"(?:\x1b\[|\x9b)([\x30-\x3f]*)([\x20-\x2f]*)([\x40-\x7e]|$)")
# what is left, in one pass: a kept colour (1), any other escape (2), or a lone control character
_REST = re.compile(r"(\x1b\[[0-9;]*m)|(\x1b[\x20-\x2f]*[\x30-\x7e]?)|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SGR_PARAMS = re.compile(r"[0-9;]*")


def _csi(m: re.Match[str], keep_sgr: bool) -> str:
    params, inter, final = m.group(1), m.group(2), m.group(3)
    if keep_sgr and final == "m" and not inter and m.group(0).startswith("\x1b") and _SGR_PARAMS.fullmatch(params):
        return m.group(0)
    return ""


def safe(text: str, *, keep_sgr: bool = False) -> str:
    """``text`` with every terminal control sequence removed (colours kept with ``keep_sgr``) and any
    other control character but tab and newline shown as ``^X``."""
    if not text or not _CTRL.search(text):
        return text
    if "\r" in text:
        text = "\n".join(_last_state(line) for line in text.split("\n"))
    text = _STRING.sub("", text)
    text = _CSI.sub(lambda m: _csi(m, keep_sgr), text)
    return _REST.sub(lambda m: _rest(m, keep_sgr), text)


def visible(text: str) -> str:
    """``text`` with every control character but tab and newline shown as ``^X`` (an escape as ``^[``): for
    text the user must read exactly, a rendered script, where removing a sequence would hide that it is there."""
    return _CTRL.sub(lambda m: _caret(m.group(0)), text) if text else text


def _rest(m: re.Match[str], keep_sgr: bool) -> str:
    if m.group(1) is not None:
        return m.group(1) if keep_sgr else ""
    if m.group(2) is not None:
        return ""
    return _caret(m.group(0))


def _last_state(line: str) -> str:
    """What a terminal shows for a line with carriage returns: its last non-empty part (``\r\n`` endings and
    a trailing ``\r`` are not a redraw)."""
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""


def _caret(ch: str) -> str:
    o = ord(ch)
    if o < 0x20:
        return "^" + chr(o + 0x40)
    if o == 0x7f:
        return "^?"
    return f"\\x{o:02x}"
