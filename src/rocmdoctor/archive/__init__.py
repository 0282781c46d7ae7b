"""Archives from strangers: the one tar rule, its scanner, the two extractors that apply it, and the ELF
reader qualification uses on what they extracted."""
