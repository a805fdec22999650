"""The experiments behind grouppref's defaults, one package per experiment (research/README.md);
they use the product only through ``grouppref.api``."""
