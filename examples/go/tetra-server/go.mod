module drover.example/tetra-server

go 1.18
