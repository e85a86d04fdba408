"""The website as readers see it, checked in a real browser.

The module builds the site into a temporary directory (the same Jupyter Book
command as ``book.py site``; ``book.py test``, which has just built the site,
passes its build in AUTODIDAX_SITE_HTML instead), serves it over HTTP on
localhost, and opens every page of the table of contents in headless
Chromium, driven through the DevTools protocol (``tests/chromium.py``). It
checks that each page loads without console errors or failed requests, that
every chapter shows its code outputs and none of them is a Python traceback,
that every chapter has its Colab launch link, that every internal link leads
to an existing page and anchor, that the previous/next links follow the table
of contents, and that the search page finds "jaxpr".

The Chinese site (``_build/html/zh_CN``, README "The Chinese edition") is
opened page by page too: no console errors, its internal links resolve, every
chapter shows the same outputs as its English page, every page of both
languages has a language switch that leads to the same page in the other
language, and the Chinese search finds a Chinese word. Screenshots of Chinese
chapters are saved (into AUTODIDAX_SCREENSHOTS if set, else a temporary
directory) after checking that their Chinese title is drawn with a font that
has Chinese glyphs (``.ci/run`` installs Debian's ``fonts-noto-cjk``).

The browser gets no network beyond localhost, so the checks do not depend on
the machine's connection; the only outside resource a page may ask for is
MathJax, from its CDN (so math is not rendered here).

Without Chromium the tests skip, saying so; under CI (``CI=true``) a missing
Chromium is a failure (``.ci/run`` installs Debian's ``chromium`` package).
Set ``AUTODIDAX_CHROMIUM`` to use a browser binary that is not on the PATH.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
import yaml
from chromium import EXECUTABLES, Browser, Tab, console_problems, requested_urls

from build_tools import i18n
from build_tools.book import SITE_BUILD
from build_tools.chapters import find_chapters, toc_pages

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGES = toc_pages(REPO_ROOT)  # e.g. "book/intro", "book/part1_interpreters", ...
CHAPTERS = [f"book/{chapter.name}" for chapter in find_chapters(REPO_ROOT)]
ZH = "zh_CN/"  # where the Chinese site lives in the English one
# Chinese chapters photographed: Part 1, Part 4 and a later one.
SCREENSHOTS = ["book/part1_interpreters", "book/part4_grad", "book/part7_scan"]
# The only resources from outside the site a page may load (blocked here).
ALLOWED_EXTERNAL = ("https://cdn.jsdelivr.net/npm/mathjax@3/",)

# One browser and one site for the whole module, on one xdist worker.
pytestmark = pytest.mark.xdist_group("browser")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def find_chromium() -> str:
    """The Chromium executable to use; skip (fail under CI) if there is none."""
    explicit = os.environ.get("AUTODIDAX_CHROMIUM")
    if explicit:
        return explicit
    for name in EXECUTABLES:
        path = shutil.which(name)
        if path:
            return path
    message = (
        f"no Chromium found (looked for {', '.join(EXECUTABLES)} on the PATH, "
        "and AUTODIDAX_CHROMIUM is not set); on Debian/Ubuntu: "
        "apt-get install chromium"
    )
    if in_ci():
        pytest.fail(f"CI=true but {message}", pytrace=False)
    pytest.skip(f"browser test skipped: {message}")


def colab_url(page: str) -> str:
    """The Colab launch link a chapter page should have, from _config.yml."""
    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    repo = config["repository"]
    github = urlsplit(repo["url"]).path.strip("/")
    path = "/".join(p for p in (repo.get("path_to_book", "").strip("/"), page) if p)
    return (
        f"{config['launch_buttons']['colab_url']}/github/{github}/blob/"
        f"{repo.get('branch', 'main')}/{path}.ipynb"
    )


# ---------------------------------------------------------------- the site


class _AnchorParser(HTMLParser):
    """Collects the ids (and <a name>s) a URL fragment can point at."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (name == "id" or (tag == "a" and name == "name")):
                self.anchors.add(value)


@functools.cache
def static_anchors(path: Path) -> frozenset[str]:
    parser = _AnchorParser()
    parser.feed(path.read_text(encoding="utf-8"))
    return frozenset(parser.anchors)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class PageReport:
    """What a page showed in the browser."""

    url: str
    problems: list[dict[str, str]]  # console errors and failed loads
    external: list[str]  # requested URLs outside the site
    failed_requests: list[str]  # requests of the site answered with >= 400
    dom: dict[str, Any] = field(default_factory=dict)


# Everything the tests read from a page's live DOM, in one round trip.
DOM_SUMMARY = """(() => {
  const outputs = [...document.querySelectorAll('.cell_output')];
  const hrefs = sel => [...document.querySelectorAll(sel)].map(a => a.href);
  return {
    title: document.title,
    outputs: outputs.length,
    tracebacks: outputs
      .filter(o => /Traceback \\(most recent call last\\)/.test(o.textContent)
                   || o.querySelector('.traceback, .output.error'))
      .map(o => o.textContent.trim().slice(0, 300)),
    stderr: outputs.filter(o => o.querySelector('.stderr'))
      .map(o => o.textContent.trim().slice(0, 300)),
    links: hrefs('a[href]'),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    colab: hrefs('a[href^="https://colab.research.google.com/"]'),
    lang: document.documentElement.lang,
    switch: hrefs('a.language-switch'),
    // each output's text and images, hashed (compared between the languages;
    // the copy buttons' labels are translated)
    outputsHash: outputs.map(o => {
      const parts = [...o.querySelectorAll('pre, img')]
        .map(e => e.tagName === 'IMG' ? e.getAttribute('src') : e.textContent);
      let h = 0;
      for (const c of parts.join('\\0')) h = (Math.imul(h, 31) + c.codePointAt(0)) | 0;
      return h;
    }),
    prev: hrefs('.prev-next-area a.left-prev'),
    next: hrefs('.prev-next-area a.right-next'),
    brokenImages: [...document.images]
      .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
    // one list of term ids per glossary entry (a term and its synonyms)
    glossaryEntries: [...document.querySelectorAll('dl.glossary > dd')].map(dd => {
      const ids = [];
      for (let dt = dd.previousElementSibling; dt && dt.tagName === 'DT';
           dt = dt.previousElementSibling) ids.unshift(dt.id);
      return ids;
    }),
  };
})()"""


# The search page's results once Sphinx's search has finished, else null.
SEARCH_RESULTS = """(() => {
  const summary = document.querySelector('#search-results .search-summary');
  if (!summary || !summary.textContent.trim()) return null;
  const links = document.querySelectorAll('#search-results ul.search li a');
  return {summary: summary.textContent, hits: [...links].map(a => a.href)};
})()"""


class Site:
    """The built site, its HTTP server and a browser tab, with page reports."""

    def __init__(self, root: Path, browser: Browser) -> None:
        self.root = root
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.tab = Tab(browser)
        self._reports: dict[str, PageReport] = {}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str) -> str:
        return self.base + path

    def load(self, path: str) -> PageReport:
        """Open ``path`` (relative to the site root) and collect its problems."""
        url = self.url(path)
        events = self.tab.goto(url)
        internal_failures = [
            f"{e['params']['response']['status']} {e['params']['response']['url']}"
            for e in events
            if e["method"] == "Network.responseReceived"
            and e["params"]["response"]["url"].startswith(self.base)
            and e["params"]["response"]["status"] >= 400
            and not self._is_implicit_favicon(e["params"]["response"]["url"])
        ]
        report = PageReport(
            url=url,
            problems=[p for p in console_problems(events) if not self.allowed(p)],
            external=[u for u in requested_urls(events) if not u.startswith(self.base)],
            failed_requests=internal_failures,
        )
        return report

    def report(self, page: str) -> PageReport:
        """Load ``page`` (a toc entry such as ``book/intro``) once; summarize it."""
        if page not in self._reports:
            report = self.load(f"{page}.html")
            report.dom = self.tab.evaluate(DOM_SUMMARY)
            self._reports[page] = report
        return self._reports[page]

    def _is_implicit_favicon(self, url: str) -> bool:
        # Browsers ask for /favicon.ico on their own; no page links to it, and
        # on a real host it lies outside the book's directory anyway.
        return url == self.base + "favicon.ico"

    def allowed(self, problem: dict[str, str]) -> bool:
        url = problem["url"]
        return url.startswith(ALLOWED_EXTERNAL) or self._is_implicit_favicon(url)

    def resolve(self, href: str, current_ids: set[str], current: str) -> str | None:
        """None if an internal link's target exists, else what is missing."""
        parts = urlsplit(href)
        path = unquote(parts.path).lstrip("/")
        target = self.root / path
        if path == "" or path.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            return f"no file {target.relative_to(self.root)}"
        fragment = unquote(parts.fragment)
        if not fragment:
            return None
        if href.split("#")[0] == current.split("#")[0]:
            anchors: set[str] | frozenset[str] = current_ids
        else:
            anchors = static_anchors(target)
        if fragment not in anchors:
            return f"no id {fragment!r} in {target.relative_to(self.root)}"
        return None


def build_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site's html directory: ``book.py test``'s build, or a new one.

    ``book.py test`` builds the site in both languages (warnings as errors)
    before running pytest and names it in AUTODIDAX_SITE_HTML; run on its own,
    this module builds both languages at the same time into a temporary
    directory with the same commands (the language switches of one language
    lead into the other), the Chinese site under the English one's zh_CN/.
    """
    prebuilt = os.environ.get("AUTODIDAX_SITE_HTML")
    if prebuilt and (Path(prebuilt) / ZH / "index.html").is_file():
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("site")
    zh = out / "zh_CN"
    builds = {
        "English": [*SITE_BUILD, "--path-output", str(out)],
        "Chinese": i18n.sphinx_argv(
            "html", zh / "html", zh / ".doctrees", language="zh_CN"
        ),
    }
    started = time.monotonic()
    running = {
        name: subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, argv in builds.items()
    }
    for name, process in running.items():
        output, _ = process.communicate()
        if process.returncode != 0:
            pytest.fail(
                f"{name} site build failed (exit {process.returncode}):\n"
                f"{output[-5000:]}",
                pytrace=False,
            )
    html = out / "_build" / "html"
    shutil.copytree(zh / "html", html / "zh_CN")
    print(f"site built in {time.monotonic() - started:.1f}s")
    return html


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    chromium = find_chromium()  # first: skip quickly when there is no browser
    html = build_site(tmp_path_factory)
    profile = tmp_path_factory.mktemp("chromium-profile")
    browser = Browser(
        chromium,
        profile,
        # No network beyond this machine: a page that needs the internet to
        # load (other than the allowed CDN) shows up as a failed request.
        extra_args=["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
        log_path=profile / "chromium.log",
    )
    site = Site(html, browser)
    try:
        yield site
    finally:
        site.close()
        browser.close()


# ---------------------------------------------------------------- the tests


def test_toc_lists_intro_chapters_and_glossary() -> None:
    assert PAGES[0] == "book/intro"
    assert CHAPTERS, "no chapters found"
    assert "book/glossary" in PAGES


@pytest.mark.parametrize("page", PAGES + [ZH + page for page in PAGES])
def test_page_loads_without_errors(site: Site, page: str) -> None:
    report = site.report(page)
    assert report.dom["title"], f"{page}: the page has no title"
    language = "zh-CN" if page.startswith(ZH) else "en"
    assert report.dom["lang"] == language, f"{page}: <html lang={report.dom['lang']}>"
    assert not report.problems, f"{page}: console errors: {report.problems}"
    assert not report.failed_requests, f"{page}: failed: {report.failed_requests}"
    unexpected = [u for u in report.external if not u.startswith(ALLOWED_EXTERNAL)]
    assert not unexpected, f"{page}: loads resources from outside: {unexpected}"
    assert not report.dom["brokenImages"], f"{page}: {report.dom['brokenImages']}"


@pytest.mark.parametrize("page", CHAPTERS + [ZH + page for page in CHAPTERS])
def test_chapter_shows_outputs_without_tracebacks(site: Site, page: str) -> None:
    dom = site.report(page).dom
    assert dom["outputs"] > 0, f"{page}: no code cell outputs on the page"
    assert not dom["tracebacks"], f"{page}: tracebacks: {dom['tracebacks']}"
    assert not dom["stderr"], f"{page}: outputs on stderr: {dom['stderr']}"


@pytest.mark.parametrize("page", CHAPTERS + [ZH + page for page in CHAPTERS])
def test_chapter_has_colab_link(site: Site, page: str) -> None:
    # The Chinese page launches the same (English) notebook.
    dom = site.report(page).dom
    url = colab_url(page.removeprefix(ZH))
    assert url in dom["colab"], f"{page}: Colab links: {dom['colab']}"


@pytest.mark.parametrize("page", CHAPTERS)
def test_chinese_chapter_shows_the_same_outputs(site: Site, page: str) -> None:
    english = site.report(page).dom["outputsHash"]
    chinese = site.report(ZH + page).dom["outputsHash"]
    assert chinese == english, f"{ZH}{page}: its outputs differ from {page}'s"


@pytest.mark.parametrize("page", PAGES + [ZH + page for page in PAGES])
def test_language_switch_leads_to_the_same_page(site: Site, page: str) -> None:
    report = site.report(page)
    other = page.removeprefix(ZH) if page.startswith(ZH) else ZH + page
    assert report.dom["switch"] == [site.url(f"{other}.html")], page
    assert site.resolve(report.dom["switch"][0], set(), report.url) is None


@pytest.mark.parametrize("site_dir", ["", ZH])
def test_root_index_leads_to_the_intro(site: Site, site_dir: str) -> None:
    site.load(f"{site_dir}index.html")  # a redirect to the root page
    intro = site.url(f"{site_dir}{PAGES[0]}.html")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and site.tab.evaluate("location.href") != intro:
        time.sleep(0.1)
    assert site.tab.evaluate("location.href") == intro


@pytest.mark.parametrize("page", PAGES + [ZH + page for page in PAGES])
def test_internal_links_resolve(site: Site, page: str) -> None:
    report = site.report(page)
    internal = [href for href in report.dom["links"] if href.startswith(site.base)]
    assert internal, f"{page}: no internal links at all"
    broken = {}
    for href in internal:
        problem = site.resolve(href, set(report.dom["ids"]), report.url)
        if problem:
            broken[href.removeprefix(site.base)] = problem
    assert not broken, f"{page}: broken internal links: {broken}"


@pytest.mark.parametrize("site_dir", ["", ZH])
@pytest.mark.parametrize("index", range(len(PAGES)))
def test_previous_and_next_follow_the_toc(
    site: Site, index: int, site_dir: str
) -> None:
    pages = [site_dir + page for page in PAGES]
    dom = site.report(pages[index]).dom
    expected_prev = [site.url(f"{pages[index - 1]}.html")] if index > 0 else []
    has_next = index + 1 < len(pages)
    expected_next = [site.url(f"{pages[index + 1]}.html")] if has_next else []
    assert dom["prev"] == expected_prev, f"{pages[index]}: previous link"
    assert dom["next"] == expected_next, f"{pages[index]}: next link"


def test_every_glossary_entry_is_linked_from_a_page(site: Site) -> None:
    entries = site.report("book/glossary").dom["glossaryEntries"]
    assert len(entries) >= 10, f"glossary entries: {entries}"
    glossary_url = site.url("book/glossary.html")
    linked = {
        href.partition("#")[2]
        for page in PAGES
        if page != "book/glossary"
        for href in site.report(page).dom["links"]
        if href.startswith(glossary_url + "#")
    }
    unlinked = [terms for terms in entries if not linked.intersection(terms)]
    assert not unlinked, f"glossary entries no page links to: {unlinked}"


def search(site: Site, query: str, site_dir: str = "") -> list[str]:
    """The pages the site's search page lists for ``query``, after checking
    that each resolves and that the search page reported no error."""
    report = site.load(f"{site_dir}search.html?q={quote(query)}")
    # Sphinx's search runs in the page's JavaScript after the load event.
    results = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        results = site.tab.evaluate(SEARCH_RESULTS)
        if results:
            break
        time.sleep(0.2)
    assert results, f"the search page never finished searching for {query!r}"
    hits = results["hits"]
    for href in hits:
        assert site.resolve(href, set(), report.url) is None, href
    later = console_problems(site.tab.browser.take_events(site.tab.session))
    problems = [p for p in report.problems + later if not site.allowed(p)]
    assert not problems, f"search page console errors: {problems}"
    return hits


def test_search_finds_jaxpr(site: Site) -> None:
    hits = search(site, "jaxpr")
    assert site.url("book/part2_jaxprs.html") in hits, hits


CHINESE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+")


def chinese_title_word() -> tuple[str, str]:
    """A chapter and a word of its Chinese title (the longest word jieba
    finds in it); skips while no chapter title is translated."""
    import jieba

    for page in CHAPTERS:
        path = i18n.catalogue_dir("zh_CN", REPO_ROOT) / f"{page}.po"
        entries = [m for m in i18n.read_catalogue(path) if m.id]
        title = entries[0] if entries else None  # a chapter's first message
        if title and title.string and not title.fuzzy:
            words = [
                word
                for run in CHINESE.findall(title.string)
                for word in jieba.cut_for_search(run)
                if len(word) > 1
            ]
            if words:
                return page, max(words, key=len)
    pytest.skip("no chapter title is translated into Chinese yet")


def test_chinese_search_finds_a_chinese_word(site: Site) -> None:
    page, word = chinese_title_word()
    hits = search(site, word, ZH)
    assert site.url(f"{ZH}{page}.html") in hits, (word, hits)


# True if the page's heading font draws two different Chinese characters
# differently (a browser without a Chinese font draws both as the same box).
DRAWS_CHINESE = """(() => {
  const family = getComputedStyle(document.querySelector('h1')).fontFamily;
  const draw = text => {
    const canvas = document.createElement('canvas');
    canvas.width = canvas.height = 48;
    const context = canvas.getContext('2d');
    context.font = `40px ${family}`;
    context.fillText(text, 2, 40);
    return canvas.toDataURL();
  };
  return draw('中') !== draw('文');
})()"""


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    explicit = os.environ.get("AUTODIDAX_SCREENSHOTS")
    if explicit:
        Path(explicit).mkdir(parents=True, exist_ok=True)
        return Path(explicit)
    return tmp_path_factory.mktemp("screenshots")


@pytest.mark.parametrize("page", SCREENSHOTS)
def test_chinese_chapter_screenshot(
    site: Site, page: str, screenshot_dir: Path
) -> None:
    site.tab.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        report = site.load(f"{ZH}{page}.html")
        assert not report.problems, report.problems
        assert site.tab.evaluate(DRAWS_CHINESE), (
            "the browser draws Chinese characters as boxes: no CJK font "
            "(Debian: apt-get install fonts-noto-cjk)"
        )
        shot = site.tab.call("Page.captureScreenshot", {"format": "png"})
    finally:
        site.tab.call("Emulation.clearDeviceMetricsOverride")
    path = screenshot_dir / f"zh_CN-{page.replace('/', '-')}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.stat().st_size > 10_000, path
    print(f"screenshot: {path}")
