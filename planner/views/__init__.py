"""What people and machines see: rich tables and JSON summaries of every contract and result."""
