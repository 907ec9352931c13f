"""Drafter training: data (`sources` -> `responses` -> `store` -> `pipeline`, grain over a tensorstore
response store), the losses (`anchors`, `objectives`, `losses` for baseline blocks, `dvd` for
draft-verify-draft), the sharded step (`step`, `sharding`), and the loop around it (`checkpoint`,
`faults`, `loop`, `plots`)."""
