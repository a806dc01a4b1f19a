// A sample application behind rsc-bridge, in Java 17 with com.sun.net.httpserver only
// (docs/BRIDGE.md): run it with `java App.java`. It receives stream entries as binary-mode
// CloudEvents, records each one it handled as a JSON line appended to APP_RECORD, and
// publishes through the bridge.
//
// Environment:
//   APP_PORT       port to listen on (127.0.0.1), default 8080
//   APP_RECORD     file to append one JSON line per handled entry (before answering 2xx):
//                  {entry_id, shard, key, seq, delivery_count, attempt, started_ms, finished_ms, app}
//   APP_HANDLE_MS  time each delivery takes (a slow application), default 0
//   APP_TOKEN      the bearer token shared with the bridge (checked on deliveries, sent on publish)
//   BRIDGE_URL     the bridge (default http://127.0.0.1:3500), for publishing
//
// Payloads are JSON objects. {"poison": true} is refused with 400 (the bridge dead-letters it);
// {"forward_to": "S"} is published to stream S through the bridge (same key, payload
// {"from": <entry id>, "seq": <seq>}) before the entry is acknowledged; a failed publish
// answers 503, so the bridge delivers the entry again later.

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.URLDecoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.Executors;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public class App {
    static final String RECORD = System.getenv("APP_RECORD");
    static final long HANDLE_MS = Long.parseLong(env("APP_HANDLE_MS", "0"));
    static final String TOKEN = env("APP_TOKEN", "");
    static final String BRIDGE = env("BRIDGE_URL", "http://127.0.0.1:3500");
    static final HttpClient CLIENT = HttpClient.newHttpClient();

    static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isBlank() ? dflt : v;
    }

    /** A `ce-*` header value, percent-decoded (the HTTP binding's encoding; `+` is itself). */
    static String ce(HttpExchange ex, String name) {
        String v = ex.getRequestHeaders().getFirst(name);
        return v == null ? null : URLDecoder.decode(v.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    /** A top-level field of a flat JSON object, as its JSON text (null when absent). */
    static String field(String json, String name) {
        Matcher m = Pattern.compile("\"" + Pattern.quote(name) + "\"\\s*:\\s*(\"(?:[^\"\\\\]|\\\\.)*\"|[^,}\\s]+)").matcher(json);
        return m.find() ? m.group(1) : null;
    }

    static String quote(String s) {
        return s == null ? "null" : "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    static int handle(HttpExchange ex, String body, long started) throws Exception {
        if (!TOKEN.isEmpty() && !("Bearer " + TOKEN).equals(ex.getRequestHeaders().getFirst("Authorization"))) {
            return 401;
        }
        if ("true".equals(field(body, "poison"))) {
            return 400;
        }
        if (HANDLE_MS > 0) {
            Thread.sleep(HANDLE_MS);
        }
        String id = ce(ex, "ce-id");
        String key = ce(ex, "ce-subject");
        String seq = field(body, "seq");
        String forward = field(body, "forward_to");
        if (forward != null) {
            String stream = forward.substring(1, forward.length() - 1);
            String rec = "{\"key\":" + quote(key) + ",\"payload\":{\"from\":" + quote(id) + ",\"seq\":" + seq + "}}";
            HttpRequest.Builder req = HttpRequest.newBuilder(URI.create(BRIDGE + "/v1/publish/" + stream))
                .header("content-type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(rec));
            if (!TOKEN.isEmpty()) {
                req.header("Authorization", "Bearer " + TOKEN);
            }
            try {
                HttpResponse<String> r = CLIENT.send(req.build(), HttpResponse.BodyHandlers.ofString());
                if (r.statusCode() != 200) {
                    System.err.println("publish failed: " + r.statusCode() + " " + r.body());
                    return 503;
                }
            } catch (IOException e) {
                System.err.println("publish failed: " + e);
                return 503;
            }
        }
        if (RECORD != null) {
            String line = "{\"entry_id\":" + quote(id) + ",\"shard\":" + ce(ex, "ce-rscshard") + ",\"key\":" + quote(key)
                + ",\"seq\":" + seq + ",\"delivery_count\":" + ce(ex, "ce-rscdeliverycount") + ",\"attempt\":"
                + ce(ex, "ce-rscattempt") + ",\"started_ms\":" + started + ",\"finished_ms\":" + System.currentTimeMillis()
                + ",\"app\":\"java\"}\n";
            synchronized (App.class) {
                Files.writeString(Path.of(RECORD), line, StandardOpenOption.CREATE, StandardOpenOption.APPEND);
            }
        }
        return 200;
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(env("APP_PORT", "8080"));
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
        server.createContext("/", ex -> {
            long started = System.currentTimeMillis();
            int status;
            try {
                String body = new String(ex.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
                status = handle(ex, body, started);
            } catch (Exception e) {
                e.printStackTrace();
                status = 500;
            }
            ex.sendResponseHeaders(status, -1);
            ex.close();
        });
        server.setExecutor(Executors.newFixedThreadPool(16));
        server.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> server.stop(0)));
        System.out.println("listening on " + server.getAddress().getPort());
    }
}
