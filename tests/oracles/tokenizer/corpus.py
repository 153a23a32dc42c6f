"""Deterministic test corpus for tokenizer parity with Hugging Face.

`text_corpus()` returns at least 2,000 cases covering English, Chinese, Japanese, Korean,
Arabic, Hebrew, Hindi, emoji and ZWJ sequences, source code in several languages, long
whitespace runs, mixed CR/LF, digits and numbers, special tokens inside text,
normalization (NFC) traps, and invalid UTF-8. `chat_corpus()` returns at least 50 chat
requests with system prompts, tools, tool calls, tool results and thinking.

Everything comes from `random.Random` with fixed seeds, so the corpus is the same on
every run and every machine. Run `python3 -m tokenizer.corpus OUT.jsonl` to write it out.

A text case is {"id": ..., "text": str} or, for invalid UTF-8, {"id": ..., "hex": bytes.hex()}.
Hugging Face can only take str, so the parity scripts give it
bytes.decode("utf-8", "replace"); pagellm takes the raw bytes and must repair them the
same way.
"""

import json
import random
import sys

SEED = 20250601

ENGLISH_WORDS = (
    "the of and to in is that it for was on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how "
    "their if will up other about out many then them these so some her would make like him into "
    "time has look two more write go see number no way could people my than first water been call "
    "who oil its now find long down day did get come made may part over new sound take only little "
    "work know place year live me back give most very after thing our just name good sentence man "
    "think say great where help through much before line right too mean old any same tell boy follow "
    "came want show also around form three small set put end does another well large must big even "
    "such because turn here why ask went men read need land different home us move try kind hand "
    "picture again change off play spell air away animal house point page letter mother answer found "
    "study still learn should America world tokenizer inference attention transformer Qwen model GPU "
    "cache page scheduler latency throughput benchmark Hugging Face PyTorch CUDA kernel"
).split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D",
                "’s", "’t", "'x", "''", "'"]

PUNCT = list(".,;:!?-—–()[]{}\"'…/\\@#$%^&*_+=<>|~`")

CHINESE = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家"
           "学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经"
           "头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者"
           "向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气"
           "信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活"
           "难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清"
           "模型推理注意力缓存分页调度器吞吐量延迟基准测试")
CJK_PUNCT = list("，。！？；：“”‘’（）《》【】、…—·")
HIRAGANA = [chr(c) for c in range(0x3041, 0x3097)]
KATAKANA = [chr(c) for c in range(0x30A1, 0x30FB)]
HALFWIDTH_KATAKANA = [chr(c) for c in range(0xFF66, 0xFF9E)]
JAPANESE_WORDS = ["こんにちは", "ありがとう", "東京", "日本語", "トークナイザー", "テスト", "推論エンジン",
                  "カタカナ", "ひらがな", "漢字", "今日は", "いい天気", "ですね", "でした", "ます"]
KOREAN_WORDS = ["안녕하세요", "감사합니다", "세계", "날씨", "토크나이저", "한국어", "테스트", "모델", "추론"]
ARABIC_WORDS = ["مرحبا", "بالعالم", "اللغة", "العربية", "نموذج", "الذكاء", "الاصطناعي", "شكرا", "كتاب"]
ARABIC_HARAKAT = [chr(c) for c in range(0x064B, 0x0653)]
HEBREW_WORDS = ["שלום", "עולם", "מודל", "שפה", "תודה"]
HINDI_WORDS = ["नमस्ते", "दुनिया", "भाषा", "मॉडल", "हिन्दी", "धन्यवाद", "कृत्रिम", "बुद्धिमत्ता", "क़लम", "ज़िंदगी"]
OTHER_SCRIPTS = ["Привет, мир", "Ελληνικά γράμματα", "ภาษาไทย", "Tiếng Việt có dấu", "Ünïcödé çàfé naïve",
                 "Español: ¿Qué tal? ¡Hola!", "Français: l'été où ça", "Deutsch: Straße, Größe, ẞ",
                 "Türkçe: İstanbul ılık", "Polski: zażółć gęślą jaźń", "ქართული", "Հայերեն", "ᠮᠣᠩᠭᠣᠯ",
                 "አማርኛ", "தமிழ்", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "বাংলা", "ગુજરાતી", "ਪੰਜਾਬੀ", "සිංහල", "ဗမာ", "ខ្មែរ"]
EMOJI = ["😀", "😂", "🥲", "❤️", "❤", "👍", "👍🏽", "👍🏿", "🎉", "🚀", "🔥", "✨", "🤖", "🧠", "🇺🇸", "🇯🇵",
         "🇩🇪", "🏳️‍🌈", "🏴‍☠️", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🧑‍🚀", "👁️‍🗨️", "1️⃣", "#️⃣", "©️", "™️",
         "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🫠", "🪿", "🧑🏻‍❤️‍💋‍🧑🏼", "☺︎", "⚽", "🀄", "🃏", "🉐"]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                  "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                  "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
PARTIAL_TOKENS = ["<|im_start", "<|im_end|", "im_end|>", "<|", "|>", "<think", "think>", "</think", "<<|im_end|>>",
                  "<|im_start|im_end|>", "<tool_call", "<|endoftext|", "< think>", "<THINK>", "<|IM_END|>"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u3000", "\xa0", "\u2028", "\u2029", "\x0b", "\x0c",
              "\x85", "\u2003", "\u200b", "\u202f", "\u205f", "\u1680", "\u180e", "\ufeff", "\x1c", "\x1d",
              "\x1e", "\x1f"]
NFC_TRAPS = ["e\u0301", "a\u0300\u0301", "o\u0308\u0304", "\u212b", "\u212a", "\u2126", "\u1e9b\u0323",
             "q\u0307\u0323", "q\u0323\u0307", "\uf900", "\uf9ff", "\u0958", "\u0915\u093c", "\u1100\u1161\u11a8",
             "\u1100\u1161", "\uac00\u11a8", "\u304b\u3099", "\u30cf\u309a", "\ufb01", "\u00c5", "A\u030a",
             "\u0340", "\u0344", "\u0374", "\u037e", "\u0387", "\u1f71", "\u2000", "\u2329", "\u232a",
             "\u0626\u0654", "\u0627\u0653", "\u09c7\u09be", "\u0b47\u0b3e", "\u0dd9\u0dcf", "\u1025\u102e",
             "\U0001d15e", "\U0002f800", "s\u0323\u0307", "\u0073\u0307\u0323", "\u1e0b\u0323", "\u0041\u0328\u0301"]


# Combining marks and compositions that Hugging Face's NFC (Unicode 9.0 tables) does not
# know but utf8proc (Unicode 15) does; pagellm must leave them alone as Hugging Face does.
LATE_MARKS = ["\u0898", "\u089c", "\u08ca", "\u09fe", "\u1ac1", "\u1ac5", "\u1acb", "\u1df6", "\u1df8",
              "\U00010d24", "\U00010eab", "\U00010f48", "\U00010f82", "\U0001145e", "\U00011935\U00011930",
              "\U00011938", "\U0001e08f", "\U0001e130", "\U0001e2ae", "\U0001e2ec", "\U0001e4ec"]


def _late_marks(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        parts.append(rng.choice(["a", "e", "\u0627", "\u0995", "x", " ", "\U00011935"]))
        for _ in range(rng.randint(0, 3)):
            parts.append(rng.choice(LATE_MARKS + ["\u0301", "\u0323", "\u0300", "\u0308", "\u064b"]))
    return "".join(parts)


def _pick(rng, items, n):
    return [rng.choice(items) for _ in range(n)]


def _english_sentence(rng):
    words = _pick(rng, ENGLISH_WORDS, rng.randint(3, 18))
    if rng.random() < 0.5:
        i = rng.randrange(len(words))
        words[i] = words[i] + rng.choice(CONTRACTIONS)
    if rng.random() < 0.3:
        words[0] = words[0].capitalize()
    if rng.random() < 0.15:
        words = [w.upper() for w in words]
    text = " ".join(words)
    text += rng.choice([".", "!", "?", "...", ",", ";", "", ":"])
    return text


def _number(rng):
    kind = rng.randrange(12)
    if kind == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 30)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if kind == 2:
        return f"{rng.randint(1, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}"
    if kind == 3:
        return f"{rng.uniform(0, 10):.3e}"
    if kind == 4:
        return f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if kind == 5:
        return "".join(chr(0x0660 + rng.randint(0, 9)) for _ in range(rng.randint(1, 8)))  # Arabic-Indic
    if kind == 6:
        return "".join(chr(0xFF10 + rng.randint(0, 9)) for _ in range(rng.randint(1, 8)))  # fullwidth
    if kind == 7:
        return "".join(chr(0x0966 + rng.randint(0, 9)) for _ in range(rng.randint(1, 6)))  # Devanagari
    if kind == 8:
        return rng.choice(["Ⅻ", "ⅷ", "²", "³", "½", "¾", "⅓", "①", "⑳", "𝟘𝟙𝟚", "٣.١٤", "१२३", "\U0001d2c0\U0001d2c1"])
    if kind == 9:
        return f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
    if kind == 10:
        return f"0x{rng.getrandbits(rng.randint(8, 64)):x}"
    return f"{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}"


CODE_TEMPLATES = [
    # Python
    "def {name}({arg}, *args, **kwargs):\n    \"\"\"{doc}\"\"\"\n    if {arg} is None:\n        return []\n"
    "    result = [x ** 2 for x in range({num}) if x % 3 == 0]\n    return result  # {doc}\n",
    "class {Name}(nn.Module):\n    def __init__(self, dim: int = {num}) -> None:\n        super().__init__()\n"
    "        self.proj = nn.Linear(dim, dim * 4, bias=False)\n\n    def forward(self, x):\n"
    "        return self.proj(x).softmax(dim=-1)\n",
    # C / C++
    "#include <stdio.h>\n\nint {name}(const char* {arg}) {{\n\tfor (int i = 0; i < {num}; ++i) {{\n"
    "\t\tprintf(\"%d: %s\\n\", i, {arg});\n\t}}\n\treturn 0;\n}}\n",
    "template <typename T>\nstd::vector<T> {name}(const std::vector<T>& {arg}) {{\n  std::vector<T> out;\n"
    "  out.reserve({arg}.size());\n  std::copy_if({arg}.begin(), {arg}.end(), std::back_inserter(out),\n"
    "               [](const T& v) {{ return v > T{{{num}}}; }});\n  return out;\n}}\n",
    # JavaScript / TypeScript
    "export async function {name}({arg}) {{\n  const res = await fetch(`/api/${{{arg}}}?n={num}`);\n"
    "  if (!res.ok) throw new Error('HTTP ' + res.status);\n  return (await res.json()).items?.map(x => x.id) ?? [];\n}}\n",
    # Rust
    "fn {name}({arg}: &[u32]) -> Option<u64> {{\n    {arg}.iter().map(|&x| x as u64).filter(|x| x % {num} == 0).max()\n}}\n",
    # Go
    "func {Name}({arg} []string) (map[string]int, error) {{\n\tcounts := make(map[string]int, {num})\n"
    "\tfor _, s := range {arg} {{\n\t\tcounts[s]++\n\t}}\n\treturn counts, nil\n}}\n",
    # SQL
    "SELECT u.id, u.name, COUNT(o.id) AS orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\n"
    "WHERE u.created_at >= '2024-01-01' AND u.{name} <> ''\nGROUP BY u.id, u.name\nHAVING COUNT(o.id) > {num}\n"
    "ORDER BY orders DESC;\n",
    # HTML / CSS
    "<!DOCTYPE html>\n<html lang=\"en\">\n  <head><meta charset=\"utf-8\"><title>{doc}</title></head>\n"
    "  <body>\n    <div class=\"{name}\" style=\"margin: {num}px; color: #ff00aa;\">&amp; &lt;tag&gt;</div>\n  </body>\n</html>\n",
    # JSON
    "{{\n  \"{name}\": {{\n    \"values\": [1, 2.5, -3e-7, null, true, false],\n    \"text\": \"{doc}\\n\\t\\u00e9\",\n"
    "    \"count\": {num}\n  }}\n}}\n",
    # Shell
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.{name}; do\n  echo \"processing $f\" >&2\n"
    "  wc -l \"$f\" | awk '{{print $1}}' >> /tmp/{arg}.txt\ndone\nexit {num}\n",
    # YAML / Makefile
    "{name}:\n  image: python:3.11\n  script:\n    - pip install -r requirements.txt\n    - pytest -q -k \"{arg}\" --maxfail={num}\n",
    "all: {name}\n\n{name}: main.o util.o\n\t$(CC) -o $@ $^ -lm\n\n%.o: %.c\n\t$(CC) -c $< -O{num}\n",
]


def _identifier(rng):
    parts = _pick(rng, ["get", "set", "user", "token", "cache", "page", "alloc", "free", "batch", "seq", "len",
                        "id", "buf", "kv", "attn", "logits", "sample", "decode", "encode"], rng.randint(1, 3))
    style = rng.randrange(3)
    if style == 0:
        return "_".join(parts)
    if style == 1:
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    return "".join(p.capitalize() for p in parts)


def _code(rng):
    template = rng.choice(CODE_TEMPLATES)
    name = _identifier(rng)
    text = template.format(name=name, Name=name[:1].upper() + name[1:], arg=_identifier(rng),
                           num=rng.randint(0, 4096), doc=_english_sentence(rng))
    if rng.random() < 0.3:
        text = text.replace("\n", "\r\n")
    if rng.random() < 0.2:
        text = text.replace("    ", "\t")
    return text


def _whitespace(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return " " * rng.choice([1, 2, 3, 4, 7, 8, 15, 16, 31, 64, 100, 257, 1000, 5000])
    if kind == 1:
        return "".join(_pick(rng, WHITESPACE, rng.randint(1, 40)))
    if kind == 2:
        words = _pick(rng, ENGLISH_WORDS, rng.randint(2, 10))
        return "".join(w + "".join(_pick(rng, WHITESPACE[:8], rng.randint(1, 6))) for w in words)
    if kind == 3:
        return "\r\n".join(_english_sentence(rng) for _ in range(rng.randint(2, 6))) + rng.choice(["", "\r\n", "\n", "\r"])
    if kind == 4:
        return rng.choice(["\n", "\r\n", "\r"]) * rng.randint(1, 50) + _english_sentence(rng)
    return _english_sentence(rng) + " " * rng.randint(1, 50) + rng.choice(["", "\n", "x", "\t\n", "  \n  y"])


def _cjk(rng):
    lang = rng.randrange(4)
    if lang == 0:
        return "".join(rng.choice(CHINESE) if rng.random() > 0.15 else rng.choice(CJK_PUNCT)
                       for _ in range(rng.randint(1, 60)))
    if lang == 1:
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(JAPANESE_WORDS))
            elif r < 0.5:
                parts.append("".join(_pick(rng, HIRAGANA, rng.randint(1, 5))))
            elif r < 0.65:
                parts.append("".join(_pick(rng, KATAKANA, rng.randint(1, 5))))
            elif r < 0.75:
                parts.append("".join(_pick(rng, HALFWIDTH_KATAKANA, rng.randint(1, 5))))
            elif r < 0.85:
                parts.append(rng.choice(CHINESE) + rng.choice(CJK_PUNCT))
            else:
                parts.append(rng.choice(["か\u3099", "は\u309a", "ｶﾞ", "ｷﾞｬ"]))
        return "".join(parts)
    if lang == 2:
        words = _pick(rng, KOREAN_WORDS, rng.randint(1, 8))
        text = " ".join(words)
        if rng.random() < 0.4:  # conjoining jamo that NFC composes
            text += " " + "".join(chr(0x1100 + rng.randint(0, 18)) + chr(0x1161 + rng.randint(0, 20))
                                  + (chr(0x11A8 + rng.randint(0, 26)) if rng.random() < 0.5 else "")
                                  for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.3:
            text += "".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 10)))
        return text
    # Mixed CJK and English
    return f"{rng.choice(CHINESE)}{rng.choice(CHINESE)} {_english_sentence(rng)} {rng.choice(JAPANESE_WORDS)}{rng.choice(CJK_PUNCT)}"


def _rtl_indic(rng):
    kind = rng.randrange(4)
    if kind == 0:
        words = []
        for _ in range(rng.randint(1, 8)):
            w = rng.choice(ARABIC_WORDS)
            if rng.random() < 0.4:
                w = "".join(c + (rng.choice(ARABIC_HARAKAT) if rng.random() < 0.5 else "") for c in w)
            words.append(w)
        return " ".join(words) + rng.choice(["، ", "؟", ".", " " + _number(rng)])
    if kind == 1:
        return " ".join(_pick(rng, HEBREW_WORDS, rng.randint(1, 6))) + rng.choice([".", "?", " 123"])
    if kind == 2:
        return " ".join(_pick(rng, HINDI_WORDS, rng.randint(1, 8))) + rng.choice(["।", "॥", "?", " " + _number(rng)])
    return rng.choice(OTHER_SCRIPTS) + " " + rng.choice(OTHER_SCRIPTS)


def _emoji(rng):
    parts = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.6:
            parts.append(rng.choice(EMOJI))
        elif r < 0.8:
            parts.append(rng.choice(ENGLISH_WORDS))
        else:
            parts.append(rng.choice(WHITESPACE[:3]))
    return "".join(parts)


def _special(rng):
    parts = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.4:
            parts.append(rng.choice(SPECIAL_TOKENS))
        elif r < 0.55:
            parts.append(rng.choice(PARTIAL_TOKENS))
        elif r < 0.8:
            parts.append(_english_sentence(rng))
        else:
            parts.append(rng.choice(["\n", " ", "", "user\n", "assistant\n", "x", "你好"]))
    return "".join(parts)


def _nfc(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        parts.append(rng.choice(NFC_TRAPS) if rng.random() < 0.6 else rng.choice(ENGLISH_WORDS))
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


RANDOM_BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
                 (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x22FF),
                 (0x2500, 0x25FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
                 (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x1D400, 0x1D4FF), (0x20000, 0x2A6DF)]


def _random_unicode(rng):
    import unicodedata
    out = []
    while len(out) < rng.randint(1, 40):
        lo, hi = rng.choice(RANDOM_BLOCKS)
        c = chr(rng.randint(lo, hi))
        # Assigned characters only: Unicode versions differ between Python, PCRE2 and utf8proc
        # on what is unassigned, which is not what these tests are about.
        if unicodedata.category(c) != "Cn":
            out.append(c)
    return "".join(out)


def _invalid_utf8(rng):
    """Raw bytes with ill-formed UTF-8 mixed into valid text."""
    bad = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xe2\x82", b"\xe0\x80\x80", b"\xed\xa0\x80",
           b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe", b"\xf0\x9f\x98",
           b"\xf0\x9f", b"\xe4\xbd", b"\xc3", b"\xa9", b"\xf8\x88\x80\x80\x80", b"\xc3\x28", b"\xe2\x28\xa1"]
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.5:
            parts.append(rng.choice(bad))
        elif r < 0.7:
            parts.append(_english_sentence(rng).encode())
        elif r < 0.85:
            parts.append(rng.choice(CHINESE).encode() + rng.choice(EMOJI).encode())
        else:
            parts.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 6))))
    return b"".join(parts)


def _long_document(rng):
    makers = [_english_sentence, _code, _cjk, _rtl_indic, _emoji, _whitespace, _number, _nfc, _special]
    pieces = []
    while sum(len(p) for p in pieces) < rng.randint(2000, 20000):
        pieces.append(rng.choice(makers)(rng))
        pieces.append(rng.choice([" ", "\n", "\n\n", "", "\r\n"]))
    return "".join(pieces)


def _edge_cases():
    cases = ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "0", "00", "000", "0000", "'", "''", "'s", " 's", "it's",
             "IT'S", "it'S", "it'ſ", "it\u212as", "don't", "won’t", "I'm", "y'all'd've", "\u00a0", "\u3000",
             "\x00", "\x00\x01\x02", "\x7f", "\x1b[31mred\x1b[0m", "\ufeffBOM", "a\u200db", "x" * 10000,
             "ab" * 3000, "😀" * 500, "中" * 3000, "1" * 1000, "\n" * 1000, "\t" * 300 + "x", " \n" * 500,
             "!" * 100, "<|im_end|>" * 20, "<think>\n\n</think>\n\n", "Hello world", "hello   world  ",
             " leading", "trailing ", "a\r\rb", "a\r\n\r\nb", "a\n\r\nb", "\r", "\r\r\r"]
    cases += [chr(c) for c in range(0, 0x80)]
    cases += ["".join(chr(c) for c in range(0x20, 0x7F))]
    return cases


def text_corpus():
    """The encode/decode cases, in a fixed order (a list of dicts, see the module doc)."""
    rng = random.Random(SEED)
    cases = []

    def add(category, maker, count):
        for i in range(count):
            value = maker(rng)
            if isinstance(value, bytes):
                cases.append({"id": f"{category}-{i}", "hex": value.hex()})
            else:
                cases.append({"id": f"{category}-{i}", "text": value})

    for i, text in enumerate(_edge_cases()):
        cases.append({"id": f"edge-{i}", "text": text})
    add("english", _english_sentence, 300)
    add("code", _code, 200)
    add("cjk", _cjk, 250)
    add("rtl-indic", _rtl_indic, 150)
    add("emoji", _emoji, 150)
    add("whitespace", _whitespace, 200)
    add("numbers", lambda r: " ".join(_number(r) for _ in range(r.randint(1, 6))), 200)
    add("special", _special, 150)
    add("nfc", _nfc, 150)
    add("unicode", _random_unicode, 150)
    add("invalid-utf8", _invalid_utf8, 120)
    add("late-marks", _late_marks, 40)
    add("long", _long_document, 25)
    # Every single byte, alone and inside text (most high bytes are invalid UTF-8 alone).
    for b in range(0x80, 0x100):
        cases.append({"id": f"byte-{b:02x}", "hex": (b"ab" + bytes([b]) + b"cd").hex()})
    return cases


def random_id_sequences(vocab_size, special_ids, count=400, seed=SEED + 1):
    """Id sequences for decode tests: uniform ids, runs of byte tokens (ids 0..255, which
    split UTF-8 characters), special tokens, and ids past the vocabulary (which decode to
    nothing)."""
    rng = random.Random(seed)
    sequences = []
    for i in range(count):
        kind = i % 4
        n = rng.randint(1, 64)
        if kind == 0:
            seq = [rng.randrange(vocab_size) for _ in range(n)]
        elif kind == 1:
            seq = [rng.randrange(256) for _ in range(n)]
        elif kind == 2:
            seq = [rng.choice(special_ids) if rng.random() < 0.3 else rng.randrange(vocab_size) for _ in range(n)]
        else:
            seq = [rng.randrange(vocab_size + 300) for _ in range(n)]
        sequences.append(seq)
    return sequences


# ---- chat conversations ------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web. Returns the top results (ünïcode ✓).",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer", "default": 5},
            "threshold": {"type": "number", "default": 0.5}, "safe": {"type": "boolean", "default": True}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression like \"2 * (3 + 4)\".",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"name": "legacy_tool", "description": "A tool without the function wrapper, with nested args.",
     "parameters": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "number"}},
                                                     "options": {"type": "object"}}}},
]


def _tool_call(rng):
    name = rng.choice(["get_weather", "search", "calculator", "legacy_tool"])
    args = {
        "get_weather": {"city": rng.choice(["Paris", "東京", "São Paulo", "New York"]), "unit": rng.choice(["celsius", "fahrenheit"])},
        "search": {"query": _english_sentence(rng), "max_results": rng.randint(1, 10), "threshold": rng.choice([0.5, 1.0, 1e-05, 2.5e+20, 0.1]), "safe": rng.choice([True, False]), "extra": None},
        "calculator": {"expression": f"{rng.randint(1, 99)} * ({rng.randint(1, 99)} + {rng.randint(1, 99)})"},
        "legacy_tool": {"items": [rng.uniform(-5, 5) for _ in range(3)], "options": {"deep": {"x": [1, "two", {"three": 3}]}}},
    }[name]
    call = {"name": name, "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.4 else args}
    if rng.random() < 0.8:
        return {"id": f"call_{rng.randint(0, 99999)}", "type": "function", "function": call}
    return call


def _user_text(rng):
    return rng.choice([_english_sentence, _cjk, _emoji, _code, _rtl_indic, _special])(rng)


def chat_corpus():
    """Chat requests as pagellm's chat-template command reads them (and the arguments of
    transformers' apply_chat_template): {"messages": [...], "tools"?: [...],
    "add_generation_prompt": bool, "enable_thinking"?: bool}."""
    rng = random.Random(SEED + 2)
    requests = []
    for i in range(80):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(["You are a helpful assistant.", "你是一个有用的助手。", _english_sentence(rng), ""])})
        use_tools = i % 3 == 0
        for turn in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": _user_text(rng)})
            last_turn = turn > 0 and rng.random() < 0.3
            if last_turn:
                break
            style = rng.randrange(6)
            answer = _user_text(rng)
            if style == 0:
                messages.append({"role": "assistant", "content": answer})
            elif style == 1:
                messages.append({"role": "assistant", "content": f"<think>\n{_english_sentence(rng)}\n</think>\n\n{answer}"})
            elif style == 2:
                messages.append({"role": "assistant", "content": answer, "reasoning_content": _english_sentence(rng)})
            elif style == 3:
                messages.append({"role": "assistant", "content": answer, "reasoning_content": None})
            elif style == 4 and use_tools:
                calls = [_tool_call(rng) for _ in range(rng.randint(1, 3))]
                messages.append({"role": "assistant", "content": rng.choice(["", "Let me check.", "<think>\nI should call a tool.\n</think>\n\n"]), "tool_calls": calls})
                for _ in calls:
                    messages.append({"role": "tool", "content": rng.choice([json.dumps({"temperature": rng.randint(-10, 35), "condition": "sunny"}), "42", _english_sentence(rng)])})
                if rng.random() < 0.5:
                    messages.append({"role": "assistant", "content": answer})
            else:
                messages.append({"role": "assistant", "content": f"<think>{_english_sentence(rng)}</think>{answer}", "thinking": _english_sentence(rng)} if rng.random() < 0.3 else {"role": "assistant", "content": answer})
        if i % 7 == 0 and messages[-1]["role"] == "user":
            # A tool result wrapped as a user message (multi-step tool use detection).
            messages.append({"role": "user", "content": "<tool_response>\n" + json.dumps({"ok": True}) + "\n</tool_response>"})
        if i % 11 == 5:
            messages.append({"role": "system", "content": "A second system message in the middle."})
            messages.append({"role": "user", "content": _user_text(rng)})
        request = {"messages": messages, "add_generation_prompt": rng.random() < 0.7}
        if use_tools:
            request["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
        thinking = rng.randrange(3)
        if thinking == 1:
            request["enable_thinking"] = True
        elif thinking == 2:
            request["enable_thinking"] = False
        requests.append(request)
    return requests + continue_corpus()


def continue_corpus():
    """Requests with continue_final_message (transformers' rules: the final message left
    open; true continues its content, a string names the field): assistant and user
    messages, reasoning, whitespace the template trims, and the errors (with
    add_generation_prompt, no such field, an empty conversation, list content)."""
    rng = random.Random(SEED + 3)
    requests = []
    for i in range(24):
        messages = [{"role": "user", "content": _user_text(rng)}]
        last = {"role": "assistant", "content": rng.choice([_user_text(rng), "The answer is",
                                                            "Trailing space ", "\nLeading", ""])}
        kind = i % 8
        if kind == 1:
            last["reasoning_content"] = _english_sentence(rng)
        elif kind == 2:
            last["content"] = f"<think>\n{_english_sentence(rng)}\n</think>\n\n{last['content']}"
        elif kind == 3:
            last = {"role": "user", "content": _user_text(rng)}
        if kind != 3:
            messages.append(last)
        request = {"messages": messages, "continue_final_message": True}
        if kind == 4:
            request["continue_final_message"] = "reasoning_content"
            messages[-1]["reasoning_content"] = _english_sentence(rng)
        elif kind == 5:
            request["add_generation_prompt"] = True  # refused: the two do not go together
        elif kind == 6:
            request["continue_final_message"] = "no_such_field"
        elif kind == 7 and i == 7:
            request["messages"] = []
        elif kind == 7:
            messages[-1]["content"] = [{"type": "text", "text": "block text"}]
        thinking = rng.randrange(3)
        if thinking:
            request["enable_thinking"] = thinking == 1
        requests.append(request)
    return requests


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "-"
    stream = sys.stdout if out == "-" else open(out, "w", encoding="utf-8")
    for case in text_corpus():
        stream.write(json.dumps(case, ensure_ascii=False) + "\n")
    for i, request in enumerate(chat_corpus()):
        stream.write(json.dumps({"id": f"chat-{i}", "chat": request}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
