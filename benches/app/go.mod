module qproxy.bench/app

go 1.24
