"""VJP rules of neural-network ops."""
