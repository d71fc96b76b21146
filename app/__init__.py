"""The Signoff server."""
