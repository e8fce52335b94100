"""The history checker (issue 35): concurrent clients in several processes record every
operation on a few hot keys through a public API while a nemesis strikes; the checker judges
the history against the rules a cache must keep (docs/reliability.md, "The history checker")."""
