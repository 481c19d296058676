"""Tables, figures and the paper audit from result records (pandas + seaborn)."""
