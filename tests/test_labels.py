"""The label check over rendered pages (moespac/analysis/labels.py): every number says how it was obtained."""

from moespac.analysis.labels import unlabelled


def test_a_number_is_labelled_by_its_line_its_cell_mark_or_a_heading_above_it():
    page = "\n".join([
        "# Table X: tokens/s of Qwen3-30B-A3B on x86_64",  # names are not numbers
        "",
        "## simulated on rtx4090-pcie4",
        "### per benchmark",
        "| gsm8k | 12.5 |",  # under a labelled heading, however deep
        "## measured rows",
        "| MoE-SpAc | 3.2 M [3.1, 3.3] n=5 (paper 25.8) |",
        "## Notes beside the paper's",  # 'paper' in a heading labels nothing
        "- the paper: +41.9 %",  # the paper's number, said where it stands
        "- best gamma per batch: {1: 2, 2: 4}",  # ours, unlabelled
        "| ours | 0.83 S |",  # a cell's own mark
        "```",
        "# not a heading inside a fence 0.5",
        "```",
    ])
    assert unlabelled(page) == [(10, "- best gamma per batch: {1: 2, 2: 4}"),
                                (13, "# not a heading inside a fence 0.5")]


def test_a_labelled_title_covers_the_page_and_timing_none_is_a_label():
    assert unlabelled("# Routing statistics (timing: none, counts)\n\n## block\n| a | 0.31 |\n") == []
    assert unlabelled("# Routing statistics\n\n## block\n| a | 0.31 |\n") == [(4, "| a | 0.31 |")]
