"""The analysis as people read it: figures (seaborn) and a self-contained HTML report whose sections are
also the Flyte Deck's tabs."""
