"""bench/doc_sections.py: a rerun of a doc's main benchmark keeps the sections other benchmarks wrote."""

from __future__ import annotations

from bench import doc_sections


def test_a_section_the_new_text_lacks_is_carried_over_and_one_it_has_is_not(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# old run\n\n<!-- fairness:start -->\nshort TTFT 8.1 s\n<!-- fairness:end -->\n"
                   "<!-- profile:start -->\nold profile\n<!-- profile:end -->\n")
    text = doc_sections.carried(doc, "# new run\n\n<!-- profile:start -->\nnew profile\n<!-- profile:end -->\n")
    doc.write_text(text)
    assert doc_sections.read(doc, "fairness") == "short TTFT 8.1 s"
    assert doc_sections.read(doc, "profile") == "new profile" and "old profile" not in text
    assert text.startswith("# new run")


def test_nothing_to_carry_from_a_missing_doc(tmp_path):
    assert doc_sections.carried(tmp_path / "absent.md", "# new\n") == "# new\n"
