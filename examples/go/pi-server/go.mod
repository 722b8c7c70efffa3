module drover.example/pi-server

go 1.18
