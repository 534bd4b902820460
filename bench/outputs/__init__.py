"""The outputs floor: the tables a run's stored rows become (`tables`: trials, leaderboard,
verdicts; `naming`: printed names; `arrays`: the reconstructions as 8-bit arrays) and what is
drawn or written from them (`figures`, `paper_tables`, `report`). Nothing here runs an attack
or knows how a run is executed."""
