"""Turns the Debian Administrator's Handbook (HTML) into plain English prose.

Publican HTML puts paragraphs in <div class="para">. Only paragraph text is kept;
code listings, tables and short fragments (navigation, captions) are dropped, so
the evaluation scores the model on running text. Chapters in reading order.
"""
import html.parser
import os
import re
import sys

ORDER = ["preface.html", "foreword.html"]
VOID = {"br", "img", "meta", "link", "hr", "input", "col", "area", "base", "wbr"}


class Prose(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.out, self.buf, self.stack = [], [], []  # stack: (tag, is_para, is_skip)

    def _in(self, idx):
        return any(e[idx] for e in self.stack)

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        cls = dict(attrs).get("class") or ""
        para = (tag == "div" and "para" in cls.split()) or tag == "p"
        skip = tag in ("pre", "script", "style", "table")
        self.stack.append((tag, para, skip))

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        while self.stack:
            t, para, _ = self.stack.pop()
            if para and not self._in(1):
                text = re.sub(r"\s+", " ", "".join(self.buf)).strip()
                if len(text.split()) >= 8:
                    self.out.append(text)
                self.buf = []
            if t == tag:
                break

    def handle_data(self, data):
        if self._in(1) and not self._in(2):
            self.buf.append(data)


def main():
    root = sys.argv[1]
    files = sorted(f for f in os.listdir(root) if f.endswith(".html") and f != "index.html")
    files = [f for f in ORDER if f in files] + [f for f in files if f not in ORDER]
    for name in files:
        p = Prose()
        with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
            p.feed(f.read())
        if p.out:
            sys.stdout.write("\n\n".join(p.out) + "\n\n")


if __name__ == "__main__":
    main()
