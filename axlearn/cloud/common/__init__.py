"""Cloud-agnostic launch pieces: the process environment contract, bundlers, local launches."""
