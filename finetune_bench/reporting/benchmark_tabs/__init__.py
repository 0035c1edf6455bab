"""The benchmark report's tabs, one module each (`reporting.benchmark_report` puts them on one page), and the
figure and cell helpers they share."""
