"""`CITATION.cff` and `LICENSE`: the citation file parses and cites the papers the methods implement."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from trl_credit.methods import CREDIT_METHODS

REPO = Path(__file__).resolve().parents[1]


def test_citation_cites_the_software_and_the_three_papers():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert str(citation["version"]) == project["version"]
    assert citation["license"] == project["license"]
    references = {reference["title"]: reference for reference in citation["references"]}
    for name in ("taco", "eapo", "tide"):
        paper = CREDIT_METHODS[name].paper
        reference = references[paper["title"]]
        identifiers = {identifier["value"] for identifier in reference["identifiers"]}
        assert f"arXiv:{paper['id']}" in identifiers
        assert reference["url"] == f"https://arxiv.org/abs/{paper['id']}"
        # Every author of the paper record, in its order ("Family, Given and ...").
        authors = [f"{a['family-names']}, {a['given-names']}" for a in reference["authors"]]
        assert " and ".join(authors) in paper["citation"]


def test_license_is_the_apache_2_text_that_pyproject_declares():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
