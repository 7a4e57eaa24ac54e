-- Load 12: a 1 KiB JSON body POSTed with CloudEvents' binary-mode headers.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Ce-Specversion"] = "1.0"
wrk.headers["Ce-Type"] = "dev.knative.bench.event"
wrk.headers["Ce-Source"] = "/bench/harness"
wrk.headers["Ce-Id"] = "00000000-0000-0000-0000-000000000001"
wrk.body = '{"data":"' .. string.rep("x", 1014) .. '"}'
