"""A Sphinx extension for the book's two languages (listed in _config.yml).

The English site is built at the root of ``_build/html``, the Chinese one
(``language: zh_CN``, translated from ``locales/zh_CN/LC_MESSAGES``) into its
own tree and copied under ``_build/html/zh_CN`` (``build_tools/book.py site``).
This extension:

* puts a language switch in every page's header ("中文" on an English page,
  "English" on a Chinese one) that leads to the same page in the other
  language (the ``language-switch.html`` template, shown before the header's
  buttons by ``article_header_end`` in _config.yml);
* keeps display math out of the catalogues (Sphinx extracts math blocks as
  messages; math is never translated);
* translates the part captions of ``_toc.yml``: they are extracted into the
  root page's catalogue, but sphinx-external-toc inserts its toctrees after
  Sphinx's translation transform, so the captions would stay English;
* gives the Chinese site Chinese labels for what the catalogues do not hold:
  the search box's text, the toggles of folded cells and dropdowns, the title
  of the page outline;
* indexes the Chinese site for search with ``ChineseSearch``: Sphinx's own
  Chinese indexer splits words with jieba only if jieba can be imported (else
  the index silently lacks every Chinese word), and runs jieba over every
  text of the page, code included, while looking each word up in a list that
  grows with the book; this one requires jieba, gives it only the runs of
  Chinese characters, and keeps the Latin words in a set.
"""

from __future__ import annotations

import re
from os import path
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes, search
from sphinx.locale import init as init_locale
from sphinx.search.zh import SearchChinese
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Where each language's site lives relative to the English one.
SITE_PREFIX = {"en": "", "zh_CN": "zh_CN/"}
SWITCH = {
    # language of the page: (label of the link, language of its target, title)
    "en": ("中文", "zh_CN", "本页的中文版"),
    "zh_CN": ("English", "en", "This page in English"),
}
# Labels of the Chinese site that are not in any page's catalogue. myst-nb
# puts an English word for what a toggle folds in place of {type}; the page's
# HTML then gets Chinese ones (ZH_FOLDED), after site_fixes has put the titles
# of folded cells on their toggles.
ZH_LABELS = {
    "search_bar_text": "搜索本书……",
    "toc_title": "本页内容",
    "nb_code_prompt_show": "显示{type}",
    "nb_code_prompt_hide": "隐藏{type}",
    "togglebutton_hint": "点击展开",
    "togglebutton_hint_hide": "点击收起",
}


def site_language(config: Any) -> str:
    language = config.language or "en"
    return language if language in SITE_PREFIX else "en"


def localize_config(app: Any, config: Any) -> None:
    """Chinese labels for the Chinese site; the switch's template path."""
    config.templates_path = [*config.templates_path, str(TEMPLATES)]
    if site_language(config) != "zh_CN":
        return
    options = dict(config.html_theme_options)
    options["search_bar_text"] = ZH_LABELS["search_bar_text"]
    options["toc_title"] = ZH_LABELS["toc_title"]
    config.html_theme_options = options
    title = translated_title(app, config)
    if title:
        config.html_title = title
    for name in ("nb_code_prompt_show", "nb_code_prompt_hide"):
        setattr(config, name, ZH_LABELS[name])
    for name in ("togglebutton_hint", "togglebutton_hint_hide"):
        if name in config:
            setattr(config, name, ZH_LABELS[name])


def translated_title(app: Any, config: Any) -> str | None:
    """The book's title (``html_title``) as the root page's catalogue
    translates it (the root page's heading is the same text), if it does."""
    import yaml
    from babel.messages.pofile import read_po

    toc = Path(app.srcdir, getattr(config, "external_toc_path", "_toc.yml"))
    if not config.html_title or not toc.is_file():
        return None
    root = yaml.safe_load(toc.read_text(encoding="utf-8")).get("root")
    domain = docname_to_domain(str(root), config.gettext_compact)
    for directory in config.locale_dirs:
        po = Path(app.srcdir, directory, config.language, "LC_MESSAGES", f"{domain}.po")
        if po.is_file():
            with po.open("rb") as file:
                message = read_po(file).get(config.html_title)
            if message and message.string and not message.fuzzy:
                return str(message.string)
    return None


class MathIsNotTranslated(SphinxTransform):
    """Mark display math untranslatable, before Sphinx's translation
    transform (priority 20) and so before the gettext builder reads it."""

    default_priority = 10

    def apply(self, **kwargs: Any) -> None:
        for node in self.document.findall(nodes.math_block):
            node["translatable"] = False


class TranslateTocCaptions(SphinxTransform):
    """Translate the captions of the toctrees that sphinx-external-toc inserts
    (its transform has priority 100), from the page's own catalogue."""

    default_priority = 101

    def apply(self, **kwargs: Any) -> None:
        if site_language(self.config) == "en":
            return
        toctrees = [
            toctree
            for toctree in self.document.findall(addnodes.toctree)
            if toctree.get("caption")
        ]
        if not toctrees:
            return
        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        dirs = [path.join(self.env.srcdir, d) for d in self.config.locale_dirs]
        catalog, found = init_locale(dirs, self.config.language, domain)
        if not found:
            return
        for toctree in toctrees:
            translated = catalog.gettext(toctree["caption"])
            if translated.strip():
                toctree["caption"] = translated


ZH_FOLDED = {"content": "单元", "source": "代码", "output": "输出", "outputs": "输出"}


def chinese_toggles(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    """The toggles of folded cells without a title say what they fold in Chinese."""
    body = context.get("body")
    if site_language(app.config) != "zh_CN" or not body:
        return
    for english, chinese in ZH_FOLDED.items():
        for verb in ("显示", "隐藏"):
            body = body.replace(
                f'admonition-title">{verb}{english}<',
                f'admonition-title">{verb}{chinese}<',
            )
    context["body"] = body


def language_switch(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    """``language_switch`` for the template: the same page in the other language."""
    language = site_language(app.config)
    label, target, title = SWITCH[language]
    to_root = "../" * pagename.count("/")  # from this page to its site's root
    # from this page to the English site's root, then into the target's site
    to_english = to_root + ("../" if SITE_PREFIX[language] else "")
    href = f"{to_english}{SITE_PREFIX[target]}{pagename}.html"
    context["language_switch"] = {
        "href": href,
        "label": label,
        "title": title,
        "lang": "zh-CN" if target == "zh_CN" else "en",
    }


class ChineseSearch(SearchChinese):
    """Sphinx's Chinese search indexer, with jieba required and kept to the
    Chinese parts of the text (see the module's docstring)."""

    chinese_runs = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")

    def init(self, options: dict[str, str]) -> None:
        import logging

        import jieba  # a missing jieba must fail the build, not the search

        jieba.setLogLevel(logging.WARNING)
        self.jieba = jieba
        self.latin_terms = set()  # type: ignore[assignment]
        super().init(options)

    def split(self, input: str) -> list[str]:
        chinese = [
            word
            for run in self.chinese_runs.findall(input)
            for word in self.jieba.cut_for_search(run)
        ]
        latin = [term.strip() for term in self.latin1_letters.findall(input)]
        self.latin_terms.update(latin)  # type: ignore[attr-defined]
        return chinese + latin


def setup(app: Any) -> dict[str, Any]:
    search.languages["zh"] = ChineseSearch
    # Before sphinx-togglebutton reads its hints (at the default priority).
    app.connect("config-inited", localize_config, priority=400)
    app.add_transform(MathIsNotTranslated)
    app.add_transform(TranslateTocCaptions)
    app.connect("html-page-context", language_switch)
    # After site_fixes has labelled the folded cells (at the default priority).
    app.connect("html-page-context", chinese_toggles, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
