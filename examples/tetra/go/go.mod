module drover.example/tetra

go 1.18
